"""max-score-picker: the highest total score wins; ties are broken at random."""

from __future__ import annotations

from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    InferenceRequest,
    ProfileResult,
    ScoredEndpoint,
)
from heimdall_proxy.plugins.pickers.common import PickerBase, PickerParams

MAX_SCORE_PICKER_TYPE = "max-score-picker"


@register(MAX_SCORE_PICKER_TYPE, PickerParams)
class MaxScorePicker(PickerBase):
    """Picks the `maxNumOfEndpoints` best-scored endpoints. Candidates are shuffled before a
    stable sort, so equal scores are chosen uniformly at random."""

    type = MAX_SCORE_PICKER_TYPE

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]
    ) -> ProfileResult:
        order = list(scored)
        self.rng.shuffle(order)
        order.sort(key=lambda s: s.score, reverse=True)
        ranked = [s.endpoint for s in order]
        return ProfileResult(targets=ranked[: self._k], ranked=ranked)
