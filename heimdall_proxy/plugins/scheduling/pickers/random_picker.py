"""random-picker: uniform random choice, scores ignored."""

from __future__ import annotations

from collections.abc import Sequence

from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    InferenceRequest,
    ProfileResult,
    ScoredEndpoint,
)
from heimdall_proxy.plugins.scheduling.pickers.common import PickerBase, PickerParams

RANDOM_PICKER_TYPE = "random-picker"


@register(RANDOM_PICKER_TYPE, PickerParams)
class RandomPicker(PickerBase):
    """Picks `maxNumOfEndpoints` distinct endpoints uniformly at random."""

    type = RANDOM_PICKER_TYPE

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        order = [s.endpoint for s in scored]
        self.rng.shuffle(order)
        # The fallback order after the random picks is random too: a random picker makes
        # no claim that one pod is better than another.
        return ProfileResult(targets=order[: self._k], ranked=order)
