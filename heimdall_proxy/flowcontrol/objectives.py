"""Which objective, priority and fairness flow a request belongs to, from its headers."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from heimdall_proxy.config.flow import ObjectiveConfig
from heimdall_proxy.framework.types import InferenceRequest

log = logging.getLogger(__name__)

OBJECTIVE_HEADER = "x-gateway-inference-objective"
#: llm-d's name of the same header, read first when both are present.
LLMD_OBJECTIVE_HEADER = "x-llm-d-inference-objective"
#: llm-d's fairness header, and GIE's older name it still accepts (the first one set wins).
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
GIE_FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
#: The flow of requests that name no fairness id (llm-d's DefaultFairnessID, so the
#: `fairness_id` label of the flow-control metrics reads as on llm-d's dashboards).
DEFAULT_FLOW = "default-flow"
#: Fairness ids are client-chosen: at most this many distinct ones get their own metric
#: label; the rest are reported as "other" (their queues stay separate).
MAX_FLOW_LABELS = 100


class Objectives:
    """The configured objectives by name. An unknown or absent objective gets priority 0,
    as a request without an InferenceObjective does in GIE."""

    def __init__(self, objectives: Iterable[ObjectiveConfig]) -> None:
        self.priority: Mapping[str, int] = {o.name: o.priority for o in objectives}
        self._warned: set[str] = set()

    def classify(self, ireq: InferenceRequest) -> None:
        headers = ireq.headers
        name = headers.get(LLMD_OBJECTIVE_HEADER) or headers.get(OBJECTIVE_HEADER, "")
        ireq.objective = name
        priority = self.priority.get(name)
        if priority is None:
            priority = 0
            # once per name, and for a bounded number of names: clients choose them
            if name and name not in self._warned and len(self._warned) < MAX_FLOW_LABELS:
                self._warned.add(name)
                log.warning("unknown objective %r in %s: priority 0", name, OBJECTIVE_HEADER)
        ireq.priority = priority
        # an explicit fairness header wins (llm-d's name over GIE's when both are present);
        # then the agent session a request-header plugin found (agent-identity); then the
        # shared default flow, as llm-d's director does
        fid = headers.get(FAIRNESS_HEADER)
        if fid is None:
            fid = headers.get(GIE_FAIRNESS_HEADER, "")
        ireq.fairness_id = fid or ireq.agent_identity or DEFAULT_FLOW
