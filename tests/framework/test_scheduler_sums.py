"""The scheduler's weighted sums: the sparse, dense and aligned paths (DefaultScores,
AlignedScores) give the same floats, in the same order, as adding each pod's clamped score one
scorer at a time."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from heimdall_proxy.framework.scheduler import SchedulerProfile, WeightedScorer
from heimdall_proxy.framework.types import (
    AlignedScores,
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    ScoredEndpoint,
    split_scored,
)
from tests.helpers import ep

REQ = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})


class Canned:
    """A scorer that answers what `make` builds from the endpoints it is given."""

    type = "canned"

    def __init__(self, name: str, make: object) -> None:
        self.name = name
        self.make = make

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        return self.make(endpoints)  # type: ignore[operator, no-any-return]


class Keep:
    """A picker that keeps what it was given."""

    type = "keep"
    name = "keep"

    def __init__(self) -> None:
        self.seen: list[tuple[list[Endpoint], list[float]]] = []

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        endpoints, totals = split_scored(scored)
        self.seen.append((list(endpoints), list(totals)))
        assert [s.score for s in scored] == totals  # the Sequence view agrees
        return ProfileResult([endpoints[0]])


def reference(
    endpoints: list[Endpoint], answers: list[tuple[float, Mapping[str, float]]]
) -> list[float]:
    """The sum as the scheduler used to make it: per pod, per scorer, clamp and add."""
    totals = [0.0] * len(endpoints)
    for weight, scores in answers:
        for i, e in enumerate(endpoints):
            value = scores.get(e.name, 0.0)
            if not value > 0.0:
                continue
            totals[i] += weight * (1.0 if value > 1.0 else value)
    return totals


def value(rng: random.Random) -> float:
    return rng.choice([0.0, 1.0, 1.7, -0.3, math.nan, 0.5, rng.random(), rng.random() / 3])


def test_every_path_sums_exactly_as_pod_by_pod() -> None:
    rng = random.Random(20261125)
    for trial in range(300):
        n = rng.choice([1, 2, 5, 40, 200])
        pods = [ep(f"p{i}") for i in range(n)]
        scorers: list[WeightedScorer] = []
        answers: list[tuple[float, Mapping[str, float]]] = []
        for s in range(rng.randrange(1, 6)):
            weight = rng.choice([1.0, 2.0, 4.0, 0.5, 3.3])
            share = rng.choice([0.0, 0.05, 0.2, 0.5, 1.0])
            named = [e.name for e in pods if rng.random() < share]
            table = {name: value(rng) for name in named}
            if rng.random() < 0.3:
                table["not-a-candidate"] = 0.9  # ignored: names no candidate
            kind = rng.random()
            if kind < 0.25:  # a score for every pod, in candidate order
                ordered = [value(rng) for _ in pods]
                full = {e.name: v for e, v in zip(pods, ordered, strict=True)}

                def aligned(
                    eps: list[Endpoint], o: list[float] = ordered, array: bool = rng.random() < 0.5
                ) -> object:  # a list or a numpy array: the scheduler adds either
                    return AlignedScores(eps, np.array(o) if array else list(o))

                scorers.append(WeightedScorer(Canned(f"s{s}", aligned), weight))  # type: ignore[arg-type]
                answers.append((weight, full))
            elif kind < 0.6:
                default = value(rng)
                full = {e.name: table.get(e.name, default) for e in pods}

                def make(eps: list[Endpoint], d: float = default, t: dict = table) -> object:
                    return DefaultScores(eps, d, dict(t))

                scorers.append(WeightedScorer(Canned(f"s{s}", make), weight))  # type: ignore[arg-type]
                answers.append((weight, full))
            else:
                scorers.append(WeightedScorer(Canned(f"s{s}", lambda _, t=table: t), weight))  # type: ignore[arg-type]
                answers.append((weight, table))
        picker = Keep()
        SchedulerProfile("p", [], scorers, picker).run(CycleState(), REQ, pods)  # type: ignore[arg-type]
        got = picker.seen[0][1]
        want = reference(pods, answers)
        assert [x.hex() for x in got] == [x.hex() for x in want], trial


def test_default_scores_is_the_full_mapping() -> None:
    pods = [ep("a"), ep("b"), ep("c")]
    scores = DefaultScores(pods, 0.8, {"b": 0.1, "gone": 0.5})
    assert scores == {"a": 0.8, "b": 0.1, "c": 0.8}
    assert dict(scores) == {"a": 0.8, "b": 0.1, "c": 0.8}
    assert len(scores) == 3
    assert scores.get("gone", 0.0) == 0.0  # not a candidate: not in the mapping
    assert "gone" not in scores


def test_scores_built_for_other_endpoints_are_read_as_a_mapping() -> None:
    """A DefaultScores over another list (not the one the scorer was given) still scores by
    name: its default covers only its own endpoints."""
    a, b, c = ep("a"), ep("b"), ep("c")
    other = DefaultScores([a, b], 0.5, {})
    picker = Keep()
    scorer = Canned("s", lambda _: other)
    SchedulerProfile("p", [], [WeightedScorer(scorer, 1.0)], picker).run(  # type: ignore[arg-type]
        CycleState(), REQ, [a, b, c]
    )
    assert picker.seen[0][1] == [0.5, 0.5, 0.0]


def test_aligned_scores_is_the_full_mapping() -> None:
    pods = [ep("a"), ep("b"), ep("c")]
    scores = AlignedScores(pods, [0.1, 0.0, 0.7])
    assert scores == {"a": 0.1, "b": 0.0, "c": 0.7}
    assert len(scores) == 3 and bool(scores) and not AlignedScores([], [])
    as_array = AlignedScores(pods, np.array([0.1, 0.0, 0.7]))
    assert dict(as_array) == dict(scores) and bool(as_array)
    assert all(type(v) is float for v in as_array.values())
    assert not AlignedScores([], np.array([]))
    assert scores.get("gone", 0.0) == 0.0 and "gone" not in scores
    with pytest.raises(ValueError, match="1 scores for 3 endpoints"):
        AlignedScores(pods, [0.1])


def test_aligned_scores_for_other_endpoints_are_read_as_a_mapping() -> None:
    """An AlignedScores over another list than the scorer was given scores by name."""
    a, b, c = ep("a"), ep("b"), ep("c")
    other = AlignedScores([c, a], [0.25, 0.75])
    picker = Keep()
    scorer = Canned("s", lambda _: other)
    SchedulerProfile("p", [], [WeightedScorer(scorer, 1.0)], picker).run(  # type: ignore[arg-type]
        CycleState(), REQ, [a, b, c]
    )
    assert picker.seen[0][1] == [0.75, 0.0, 0.25]
