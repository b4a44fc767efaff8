"""max-score-picker: the highest total score wins; ties are broken at random."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    InferenceRequest,
    ProfileResult,
    ScoredEndpoint,
)
from heimdall_proxy.plugins.pickers.common import PickerParams, make_rng

MAX_SCORE_PICKER_TYPE = "max-score-picker"


@register(MAX_SCORE_PICKER_TYPE, PickerParams)
class MaxScorePicker(BasePlugin[PickerParams]):
    """Picks the `maxNumOfEndpoints` best-scored endpoints. Candidates are shuffled before a
    stable sort, so equal scores are chosen uniformly at random."""

    type = MAX_SCORE_PICKER_TYPE

    def __init__(self, name: str, params: PickerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.rng = make_rng()
        self._k = params.max_num_of_endpoints

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]
    ) -> ProfileResult:
        order = list(scored)
        self.rng.shuffle(order)
        order.sort(key=lambda s: s.score, reverse=True)
        ranked = [s.endpoint for s in order]
        return ProfileResult(targets=ranked[: self._k], ranked=ranked)
