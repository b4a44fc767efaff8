"""weighted-random-picker: random choice in proportion to score (A-Res reservoir sampling)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    InferenceRequest,
    ProfileResult,
    ScoredEndpoint,
    split_scored,
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
        # The draws are the generator's, one per endpoint in candidate order (a seeded picker
        # picks what it always picked); the keys and their order are computed with numpy:
        # at 1,024 pods a Python loop of powers and a sort of tuples was a third of a decision.
        endpoints, totals = split_scored(scored)
        n = len(endpoints)
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
