"""queue-scorer: fewer waiting requests, higher score."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.scheduling.scorers.minmax import inverted_min_max

QUEUE_SCORER_TYPE = "queue-scorer"


@register(QUEUE_SCORER_TYPE)
class QueueScorer(BasePlugin[NoParams]):
    """Reads `vllm:num_requests_waiting`. The pod with the fewest waiting requests scores 1.0,
    the one with the most 0.0, others proportionally (min-max over the candidates); all
    equal -> 1.0."""

    type = QUEUE_SCORER_TYPE

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        return inverted_min_max(endpoints, [float(e.metrics.waiting) for e in endpoints])
