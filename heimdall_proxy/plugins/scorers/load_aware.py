"""load-aware-scorer: scores by waiting-queue length against an overload threshold."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

LOAD_AWARE_SCORER_TYPE = "load-aware-scorer"


class LoadAwareParams(PluginParams):
    threshold: int = Field(default=128, gt=0)


@register(LOAD_AWARE_SCORER_TYPE, LoadAwareParams)
class LoadAwareScorer(BasePlugin[LoadAwareParams]):
    """Reads `vllm:num_requests_waiting`. An empty queue scores 0.5; the score falls linearly
    to 0.0 as the queue reaches `threshold` and stays 0.0 beyond it:
    `0.5 * (1 - min(waiting, threshold) / threshold)`.

    Seed 001's prose also says "0.5 + waiting/threshold", which would make a longer queue
    score higher and contradicts its own "a higher score indicates a lighter load"; this is
    the consistent reading (and llm-d's). Unlike queue-scorer, the score does not depend on
    the other candidates, so small differences between lightly loaded pods stay small."""

    type = LOAD_AWARE_SCORER_TYPE

    def __init__(self, name: str, params: LoadAwareParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._threshold = float(params.threshold)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        t = self._threshold
        return {e.name: 0.5 * (1.0 - min(float(e.metrics.waiting), t) / t) for e in endpoints}
