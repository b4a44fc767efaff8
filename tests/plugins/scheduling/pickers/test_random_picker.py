"""random-picker."""

from __future__ import annotations

import random
from collections import Counter

from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, ScoredEndpoint
from heimdall_proxy.plugins.scheduling.pickers.common import PickerParams
from heimdall_proxy.plugins.scheduling.pickers.random_picker import RANDOM_PICKER_TYPE, RandomPicker

REQ = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})


def picker(k: int = 1, seed: int = 99) -> RandomPicker:
    p = RandomPicker(
        "random-picker",
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


def test_type_name() -> None:
    assert RANDOM_PICKER_TYPE == "random-picker"


def test_uniform_and_ignores_scores() -> None:
    cands = scored(best=1.0, mid=0.5, worst=0.0, zero=0.0)
    p = picker()
    counts = Counter(p.pick(CycleState(), REQ, cands).targets[0].name for _ in range(8000))
    assert set(counts) == {"best", "mid", "worst", "zero"}
    for n in counts:
        assert abs(counts[n] / 8000 - 0.25) < 0.03, counts


def test_k_distinct_and_ranked_holds_all() -> None:
    cands = scored(a=0.1, b=0.2, c=0.3, d=0.4, e=0.5)
    p = picker(k=3)
    firsts = set()
    for _ in range(200):
        result = p.pick(CycleState(), REQ, cands)
        targets = [e.name for e in result.targets]
        assert len(targets) == 3
        assert len(set(targets)) == 3
        assert sorted(e.name for e in result.ranked) == ["a", "b", "c", "d", "e"]
        # the picks lead the fallback order
        assert [e.name for e in result.ranked[:3]] == targets
        firsts.add(targets[0])
    assert firsts == {"a", "b", "c", "d", "e"}


def test_k_larger_than_candidates() -> None:
    result = picker(k=10).pick(CycleState(), REQ, scored(a=0.0, b=0.0))
    assert sorted(e.name for e in result.targets) == ["a", "b"]


def test_seeded_rng_is_deterministic() -> None:
    cands = scored(a=0, b=0, c=0, d=0)
    p1, p2 = picker(seed=5), picker(seed=5)
    seq1 = [p1.pick(CycleState(), REQ, cands).targets[0].name for _ in range(50)]
    seq2 = [p2.pick(CycleState(), REQ, cands).targets[0].name for _ in range(50)]
    assert seq1 == seq2
    assert len(set(seq1)) > 1
