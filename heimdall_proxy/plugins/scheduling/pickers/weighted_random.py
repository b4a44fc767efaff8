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
from heimdall_proxy.plugins.scheduling.pickers.draws import uniforms

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
        u = uniforms(self.rng, n)  # the n draws of n calls, at once
        w = np.asarray(totals, dtype=float)
        positive = w > 0.0
        np.maximum(u, 5e-324, out=u, where=positive)  # 0 would give every weight one key
        with np.errstate(divide="ignore"):
            keys = np.where(positive, u ** (1.0 / np.where(positive, w, 1.0)), -1.0 - u)
        k = self._k
        if k >= n:
            ranked = _rank(endpoints, keys)
            return ProfileResult(targets=ranked[:k], ranked=ranked)
        # Only the k largest keys are picked: they are selected in one pass and only they
        # are sorted; the full ranking (the fallback order, read only when a picked pod
        # cannot be reached) is made when first read, from the same keys. At 1,024 pods the
        # full sort and the list of every pod were a quarter of a decision.
        return ProfileResult(targets=_top(endpoints, keys, k), rank=lambda: _rank(endpoints, keys))

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


def _rank(endpoints: list[Endpoint], keys: np.ndarray) -> list[Endpoint]:
    """Every endpoint by descending (key, position): ascending stable, reversed, puts the
    largest key first and ties by the larger position first."""
    order = np.argsort(keys, kind="stable")[::-1].tolist()
    return list(map(endpoints.__getitem__, order))


def _top(endpoints: list[Endpoint], keys: np.ndarray, k: int) -> list[Endpoint]:
    """The first `k` of `_rank(endpoints, keys)`, 0 < k < len(keys), without ranking the
    rest: every key at least the k-th largest (ties included, so the tie-break by position
    is that of the full ranking) is sorted as `_rank` sorts, and the first k taken."""
    n = len(keys)
    bar = keys.max() if k == 1 else keys[np.argpartition(keys, n - k)[n - k]]
    near = np.flatnonzero(keys >= bar)
    # lexsort: by key, then by position, ascending; reversed as in `_rank`
    order = near[np.lexsort((near, keys[near]))[::-1][:k]].tolist()
    return list(map(endpoints.__getitem__, order))
