"""random-picker: uniform random choice, scores ignored."""

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

RANDOM_PICKER_TYPE = "random-picker"


@register(RANDOM_PICKER_TYPE, PickerParams)
class RandomPicker(BasePlugin[PickerParams]):
    """Picks `maxNumOfEndpoints` distinct endpoints uniformly at random."""

    type = RANDOM_PICKER_TYPE

    def __init__(self, name: str, params: PickerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.rng = make_rng()
        self._k = params.max_num_of_endpoints

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]
    ) -> ProfileResult:
        order = [s.endpoint for s in scored]
        self.rng.shuffle(order)
        # The fallback order after the random picks is random too: a random picker makes
        # no claim that one pod is better than another.
        return ProfileResult(targets=order[: self._k], ranked=order)
