"""weighted-random-picker: random choice in proportion to score (A-Res reservoir sampling)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    ScoredEndpoint,
    split_scored,
)
from heimdall_proxy.plugins.scheduling.pickers.common import PickerBase, PickerParams

WEIGHTED_RANDOM_PICKER_TYPE = "weighted-random-picker"
#: Candidates from which the keys are computed with numpy rather than in a loop.
SMALL = 48


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
        # The draws are the generator's, one per endpoint in candidate order (a seeded picker
        # picks what it always picked). Few candidates: keyed in a loop; many: the keys and
        # their order in numpy (at 1,024 pods the loop and a sort of tuples were a third of a
        # decision; under SMALL numpy's per-call cost is the larger). Both rank alike.
        endpoints, totals = split_scored(scored)
        n = len(endpoints)
        if n < SMALL:
            return self._pick_few(endpoints, totals)
        # n draws, in C: iter(f, None) calls f until it returns None, which random() never does
        u = np.fromiter(iter(self.rng.random, None), float, n)
        w = np.asarray(totals, dtype=float)
        positive = w > 0.0
        np.maximum(u, 5e-324, out=u, where=positive)  # 0 would give every weight one key
        with np.errstate(divide="ignore"):
            keys = np.where(positive, u ** (1.0 / np.where(positive, w, 1.0)), -1.0 - u)
        # ascending stable, reversed: the largest key first, ties by the larger position
        # first, as a descending sort of (key, position) pairs orders them
        order = np.argsort(keys, kind="stable")[::-1].tolist()
        ranked = list(map(endpoints.__getitem__, order))
        return ProfileResult(targets=ranked[: self._k], ranked=ranked)

    def _pick_few(self, endpoints: list[Endpoint], totals: list[float]) -> ProfileResult:
        rnd = self.rng.random
        keyed: list[tuple[float, int]] = []
        for i, w in enumerate(totals):
            if w > 0.0:
                u = rnd() or 5e-324  # u in (0, 1): 0 would give every weight the same key
                keyed.append((u ** (1.0 / w), i))
            else:
                keyed.append((-1.0 - rnd(), i))  # below every positive key, random order
        keyed.sort(reverse=True)
        ranked = [endpoints[i] for _, i in keyed]
        return ProfileResult(targets=ranked[: self._k], ranked=ranked)
