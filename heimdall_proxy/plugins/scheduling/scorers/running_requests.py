"""running-requests-size-scorer: fewer running requests, higher score."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.scheduling.scorers.minmax import inverted_min_max

RUNNING_REQUESTS_SIZE_SCORER_TYPE = "running-requests-size-scorer"


@register(RUNNING_REQUESTS_SIZE_SCORER_TYPE)
class RunningRequestsSizeScorer(BasePlugin[NoParams]):
    """Reads `vllm:num_requests_running`; min-max over the candidates like queue-scorer
    (fewest running -> 1.0, most -> 0.0, all equal -> 1.0)."""

    type = RUNNING_REQUESTS_SIZE_SCORER_TYPE

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        return inverted_min_max(endpoints, [float(e.metrics.running) for e in endpoints])
