"""weighted-random-picker (A-Res)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, ScoredEndpoint
from heimdall_proxy.plugins.scheduling.pickers.common import PickerParams
from heimdall_proxy.plugins.scheduling.pickers.weighted_random import (
    WEIGHTED_RANDOM_PICKER_TYPE,
    WeightedRandomPicker,
)

REQ = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})
N = 20000


def picker(k: int = 1, seed: int = 2024) -> WeightedRandomPicker:
    p = WeightedRandomPicker(
        "weighted-random-picker",
        PickerParams.model_validate({"maxNumOfEndpoints": k}),
        None,  # type: ignore[arg-type]
    )
    p.rng = random.Random(seed)
    return p


def scored(**scores: float) -> list[ScoredEndpoint]:
    return [
        ScoredEndpoint(Endpoint(name=n, url=f"http://{n}:80", host=n, port=80), s)
        for n, s in scores.items()
    ]


def first_pick_counts(p: WeightedRandomPicker, cands: list[ScoredEndpoint]) -> Counter[str]:
    return Counter(p.pick(CycleState(), REQ, cands).targets[0].name for _ in range(N))


def test_type_name() -> None:
    assert WEIGHTED_RANDOM_PICKER_TYPE == "weighted-random-picker"


@pytest.mark.parametrize(
    "scores",
    [
        {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4},
        {"a": 2.0, "b": 1.0, "c": 1.0},  # totals from weighted scorers may exceed 1
        {"a": 0.01, "b": 0.99},
    ],
)
def test_first_pick_frequency_matches_score_share(scores: dict[str, float]) -> None:
    counts = first_pick_counts(picker(), scored(**scores))
    total = sum(scores.values())
    for name, weight in scores.items():
        expected = weight / total
        assert abs(counts[name] / N - expected) < 0.015, (name, counts[name] / N, expected)


def test_zero_scores_never_first_when_a_positive_exists() -> None:
    cands = scored(z1=0.0, pos=0.05, z2=0.0, z3=0.0)
    p = picker()
    for _ in range(2000):
        result = p.pick(CycleState(), REQ, cands)
        assert result.targets[0].name == "pos"
        assert result.ranked[0].name == "pos"
        assert sorted(e.name for e in result.ranked[1:]) == ["z1", "z2", "z3"]


def test_nan_score_counts_as_zero() -> None:
    cands = scored(nan=math.nan, pos=0.5)
    p = picker()
    assert {p.pick(CycleState(), REQ, cands).targets[0].name for _ in range(500)} == {"pos"}


def test_all_zero_is_uniform() -> None:
    counts = first_pick_counts(picker(), scored(a=0.0, b=0.0, c=0.0))
    assert set(counts) == {"a", "b", "c"}
    for name in "abc":
        assert abs(counts[name] / N - 1 / 3) < 0.015, counts


def test_k_distinct_and_zero_scores_last() -> None:
    cands = scored(a=0.5, b=0.3, c=0.2, z=0.0)
    p = picker(k=3)
    seen_first = Counter()
    for _ in range(2000):
        result = p.pick(CycleState(), REQ, cands)
        targets = [e.name for e in result.targets]
        assert len(targets) == 3
        assert len(set(targets)) == 3
        assert "z" not in targets  # three positive scores outrank any zero
        assert [e.name for e in result.ranked][-1] == "z"
        assert sorted(e.name for e in result.ranked) == ["a", "b", "c", "z"]
        seen_first[targets[0]] += 1
    assert set(seen_first) == {"a", "b", "c"}
    assert seen_first["a"] > seen_first["b"] > seen_first["c"]


def test_k_larger_than_candidates_returns_all() -> None:
    result = picker(k=4).pick(CycleState(), REQ, scored(a=1.0, b=0.0))
    assert [e.name for e in result.targets] == ["a", "b"]


def test_rng_returning_zero_still_prefers_heavier_weight() -> None:
    class ZeroRng(random.Random):
        def random(self) -> float:
            return 0.0

    p = picker()
    p.rng = ZeroRng()
    # u == 0 would give every weight the key 0 (and equal keys fall back to the reverse index
    # order, which would put "light" first); the picker substitutes a tiny u instead.
    result = p.pick(CycleState(), REQ, scored(heavy=3.0, light=1.5))
    assert [e.name for e in result.ranked] == ["heavy", "light"]


def reference_ranking(rng: random.Random, scores: list[float]) -> list[int]:
    """A-Res pod by pod, as the picker is defined: one draw per candidate in order, key
    u ** (1 / w) for w > 0 (u = 0 read as the smallest positive float), -1 - u otherwise,
    then the keys in descending order (ties: the later candidate first)."""
    keyed = []
    for i, w in enumerate(scores):
        if w > 0.0:
            u = rng.random() or 5e-324
            keyed.append((u ** (1.0 / w), i))
        else:
            keyed.append((-1.0 - rng.random(), i))
    keyed.sort(reverse=True)
    return [i for _, i in keyed]


def test_the_ranking_is_the_pod_by_pod_rule_on_the_same_draws() -> None:
    """The numpy keys and order are those of the definition above, for the same seed: a
    seeded picker picks exactly what the loop it replaced picked."""
    rng = random.Random(38)
    for trial in range(200):
        n = rng.choice([1, 2, 7, 64, 300])
        scores = [
            rng.choice([0.0, -1.0, math.nan, 1e-9, rng.random(), 3 * rng.random()])
            for _ in range(n)
        ]
        cands = [
            ScoredEndpoint(Endpoint(name=f"p{i}", url=f"http://p{i}:80", host=f"p{i}", port=80), w)
            for i, w in enumerate(scores)
        ]
        p = picker(k=2, seed=trial)
        got = p.pick(CycleState(), REQ, cands)
        want = reference_ranking(random.Random(trial), scores)
        assert [e.name for e in got.ranked] == [f"p{i}" for i in want], trial
        assert got.targets == got.ranked[:2]


class _Repeating(random.Random):
    """Draws from a few values only, so that many keys tie."""

    def random(self) -> float:
        return super().random() // 0.25 * 0.25


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_the_top_k_without_a_full_ranking_is_the_pod_by_pod_rule(k: int) -> None:
    """The targets are selected from the keys without ranking every pod (the ranking is made
    when first read): they are the first k of the pod-by-pod rule, ties at the k-th key
    included (tiny weights give key 0.0 to most pods, repeated draws equal keys)."""
    rng = random.Random(k)
    for trial in range(40):
        n = rng.choice([48, 64, 300, 1024])
        tiny = rng.random() < 0.5
        scores = [
            rng.choice([0.0, 1e-9, 1e-9, 1.0, 0.5] if tiny else [0.0, rng.random(), 2.0])
            for _ in range(n)
        ]
        cands = [
            ScoredEndpoint(Endpoint(name=f"p{i}", url=f"http://p{i}:80", host=f"p{i}", port=80), w)
            for i, w in enumerate(scores)
        ]
        repeating = trial % 3 == 0
        p = picker(k=k, seed=trial)
        if repeating:
            p.rng = _Repeating(trial)
        got = p.pick(CycleState(), REQ, cands)
        targets = [e.name for e in got.targets]  # read before the ranking is made
        want = reference_ranking(_Repeating(trial) if repeating else random.Random(trial), scores)
        assert targets == [f"p{i}" for i in want[:k]], (k, trial)
        assert [e.name for e in got.ranked] == [f"p{i}" for i in want], (k, trial)
