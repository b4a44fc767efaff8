"""weighted-random-picker: random choice in proportion to score (A-Res reservoir sampling)."""

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

WEIGHTED_RANDOM_PICKER_TYPE = "weighted-random-picker"


@register(WEIGHTED_RANDOM_PICKER_TYPE, PickerParams)
class WeightedRandomPicker(PickerBase):
    """Weighted sampling without replacement (Efraimidis-Spirakis A-Res): each endpoint with
    score w > 0 draws key = u^(1/w), u uniform in (0, 1); the `maxNumOfEndpoints` largest keys
    win, so the first pick has probability w / sum(w). Zero-scored endpoints come after every
    positive one, in random order; when all scores are zero the choice is uniform."""

    type = WEIGHTED_RANDOM_PICKER_TYPE

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        rnd = self.rng.random
        keyed: list[tuple[float, int]] = []
        for i, s in enumerate(scored):
            if s.score > 0.0:
                u = rnd() or 5e-324  # u in (0, 1): 0 would give every weight the same key
                keyed.append((u ** (1.0 / s.score), i))
            else:
                keyed.append((-1.0 - rnd(), i))  # below every positive key, random order
        keyed.sort(reverse=True)
        ranked = [scored[i].endpoint for _, i in keyed]
        return ProfileResult(targets=ranked[: self._k], ranked=ranked)
