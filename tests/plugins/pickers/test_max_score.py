"""max-score-picker."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, ScoredEndpoint
from heimdall_proxy.plugins.pickers.common import PickerParams
from heimdall_proxy.plugins.pickers.max_score import MAX_SCORE_PICKER_TYPE, MaxScorePicker
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
