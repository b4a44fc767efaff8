"""max-score-picker."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, ScoredEndpoint
from heimdall_proxy.plugins.scheduling.pickers.common import PickerParams
from heimdall_proxy.plugins.scheduling.pickers.max_score import (
    MAX_SCORE_PICKER_TYPE,
    MaxScorePicker,
)
from tests.helpers import ep

REQ = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})


def picker(k: int = 1, seed: int = 1234) -> MaxScorePicker:
    p = MaxScorePicker(
        "max-score-picker",
        PickerParams.model_validate({"maxNumOfEndpoints": k}),
        None,  # type: ignore[arg-type]
    )
    p.rng = random.Random(seed)
    return p


def scored(**scores: float) -> list[ScoredEndpoint]:
    return [ScoredEndpoint(ep(n), s) for n, s in scores.items()]


def names(endpoints: list[Endpoint]) -> list[str]:
    return [e.name for e in endpoints]


def test_type_and_default_k() -> None:
    assert MAX_SCORE_PICKER_TYPE == "max-score-picker"
    assert PickerParams().max_num_of_endpoints == 1
    with pytest.raises(ValidationError):
        PickerParams.model_validate({"maxNumOfEndpoints": 0})


def test_highest_score_wins() -> None:
    cands = scored(a=0.2, b=1.7, c=0.9, d=1.69)
    for seed in range(20):
        result = picker(seed=seed).pick(CycleState(), REQ, cands)
        assert names(result.targets) == ["b"]
        assert names(result.ranked) == ["b", "d", "c", "a"]


def test_returns_the_candidate_objects() -> None:
    cands = scored(a=0.0, b=1.0)
    result = picker().pick(CycleState(), REQ, cands)
    assert result.targets[0] is cands[1].endpoint


def test_ties_are_broken_at_random() -> None:
    cands = scored(low=0.1, t1=0.8, t2=0.8, t3=0.8)
    p = picker(seed=7)
    counts = Counter(p.pick(CycleState(), REQ, cands).targets[0].name for _ in range(3000))
    assert set(counts) == {"t1", "t2", "t3"}
    for name in ("t1", "t2", "t3"):
        assert 800 < counts[name] < 1200, counts


def test_input_order_is_not_changed() -> None:
    cands = scored(a=0.1, b=0.9, c=0.5)
    before = list(cands)
    picker().pick(CycleState(), REQ, cands)
    assert cands == before


def test_k_returns_distinct_best() -> None:
    cands = scored(a=0.3, b=0.9, c=0.1, d=0.8, e=0.5)
    result = picker(k=2).pick(CycleState(), REQ, cands)
    assert names(result.targets) == ["b", "d"]
    assert names(result.ranked) == ["b", "d", "e", "a", "c"]


def test_k_with_ties_picks_distinct_endpoints() -> None:
    cands = scored(a=1.0, b=1.0, c=1.0, d=0.0)
    p = picker(k=2, seed=3)
    seen = set()
    for _ in range(200):
        result = p.pick(CycleState(), REQ, cands)
        targets = names(result.targets)
        assert len(set(targets)) == 2
        assert "d" not in targets
        seen.add(tuple(sorted(targets)))
        assert sorted(names(result.ranked)) == ["a", "b", "c", "d"]
        assert names(result.ranked)[-1] == "d"
    assert seen == {("a", "b"), ("a", "c"), ("b", "c")}


def test_k_larger_than_candidates_returns_all() -> None:
    result = picker(k=5).pick(CycleState(), REQ, scored(a=0.1, b=0.2))
    assert names(result.targets) == ["b", "a"]
    assert names(result.ranked) == ["b", "a"]


def test_top_k_takes_whole_levels_in_score_order() -> None:
    """k = 4 over levels {0.9: 2 pods, 0.7: 3 pods, 0.1: 1}: both 0.9 pods first (in some
    order), then two of the three 0.7 pods; the ranking then lists the third 0.7 pod and
    the 0.1 pod."""
    cands = scored(a=0.7, b=0.9, c=0.1, d=0.7, e=0.9, f=0.7)
    p = picker(k=4, seed=11)
    for _ in range(50):
        result = p.pick(CycleState(), REQ, cands)
        targets = names(result.targets)
        assert sorted(targets[:2]) == ["b", "e"]
        assert set(targets[2:]) < {"a", "d", "f"} and len(set(targets[2:])) == 2
        ranked = names(result.ranked)
        assert ranked[:4] == targets
        assert sorted(ranked[4:5] + targets[2:]) == ["a", "d", "f"]
        assert ranked[5] == "c"


def test_seeded_picks_are_reproducible() -> None:
    cands = scored(a=1.0, b=1.0, c=1.0, d=1.0, e=0.5)
    first = [names(picker(k=2, seed=5).pick(CycleState(), REQ, cands).ranked) for _ in range(3)]
    again = [names(picker(k=2, seed=5).pick(CycleState(), REQ, cands).ranked) for _ in range(3)]
    assert first == again


def test_ordered_top_two_among_ties_is_uniform() -> None:
    """Every ordered pair of four tied pods is equally likely (12 pairs, 6,000 draws: 500
    expected each; 350..650 is more than 6 standard deviations wide)."""
    cands = scored(a=0.5, b=0.5, c=0.5, d=0.5, low=0.1)
    p = picker(k=2, seed=99)
    counts = Counter(tuple(names(p.pick(CycleState(), REQ, cands).targets)) for _ in range(6000))
    assert len(counts) == 12
    for pair, n in counts.items():
        assert "low" not in pair
        assert 350 < n < 650, counts


def test_fallback_ranking_orders_the_rest_of_a_tie_uniformly() -> None:
    """The ranking is the pick, then the three tied pods left, then the lower score; the 24
    orders of the four tied pods are equally likely (3,000 draws, 125 expected each; 60..190
    is more than 5.8 standard deviations each side, and the generator is seeded)."""
    cands = scored(a=0.5, b=0.5, c=0.5, d=0.5, low=0.1)
    p = picker(seed=4)
    orders: Counter[tuple[str, ...]] = Counter()
    for _ in range(3000):
        result = p.pick(CycleState(), REQ, cands)
        ranked = names(result.ranked)
        assert ranked[0] == result.targets[0].name
        assert ranked[-1] == "low" and sorted(ranked[:4]) == ["a", "b", "c", "d"]
        orders[tuple(ranked[:4])] += 1
    assert len(orders) == 24
    assert all(60 < n < 190 for n in orders.values()), orders


@pytest.mark.slow
def test_many_pods_tie_uniformly() -> None:
    """1,024 pods, 256 of them tied at the top: each of those is picked about equally often
    (10,240 draws, 40 expected per pod; 10..80 is > 4.7 standard deviations each side, over
    256 pods a false alarm about once in 10,000 runs)."""
    rng = random.Random(3)
    pods = {f"p{i}": (1.0 if i % 4 == 0 else rng.random() * 0.9) for i in range(1024)}
    cands = scored(**pods)
    p = picker(seed=21)
    counts = Counter(p.pick(CycleState(), REQ, cands).targets[0].name for _ in range(10240))
    assert set(counts) == {f"p{i}" for i in range(0, 1024, 4)}
    assert min(counts.values()) > 10 and max(counts.values()) < 80, counts.most_common(3)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_when_every_candidate_is_picked_the_ranking_is_the_targets(k: int) -> None:
    cands = scored(a=0.5) if k == 1 else scored(a=0.5, b=0.9, c=0.9)[:k]
    result = picker(k=3).pick(CycleState(), REQ, cands)
    assert result.has_ranking()
    assert names(result.ranked) == names(result.targets)
    assert result.ranked is not result.targets  # a reassigned ranking leaves the targets alone
