"""load-aware-scorer: scores by waiting-queue length against an overload threshold."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    AlignedScores,
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
)

LOAD_AWARE_SCORER_TYPE = "load-aware-scorer"

#: Queue lengths whose score is remembered (a bound, whatever the pods report).
_KNOWN_MAX = 4096


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
        self._known: dict[int, float] = {}  # queue length -> score

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        # An empty queue scores 0.5 * (1 - 0 / t) = 0.5: only pods with a queue are listed,
        # each queue length's score computed once (at 1,024 pods the arithmetic per pod was
        # most of this scorer's time).
        known = self._known
        waits = [e.metrics.waiting for e in endpoints]
        if (len(waits) - waits.count(0)) * 4 < len(waits):  # few queues: name those
            return DefaultScores(
                endpoints,
                0.5,
                {
                    e.name: known[w] if w in known else self._score(w)
                    for e, w in zip(endpoints, waits, strict=True)
                    if w
                },
            )
        return AlignedScores(
            endpoints, [(known[w] if w in known else self._score(w)) if w else 0.5 for w in waits]
        )

    def _score(self, waiting: int) -> float:
        t = self._threshold
        value = 0.5 * (1.0 - min(float(waiting), t) / t)
        if len(self._known) < _KNOWN_MAX:
            self._known[waiting] = value
        return value
