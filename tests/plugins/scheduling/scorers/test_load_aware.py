"""load-aware-scorer: 0.5 for an empty queue, linearly down to 0 at the threshold."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.load_aware import LoadAwareParams, LoadAwareScorer
from tests.helpers import ep
from tests.plugins.helpers import req


def test_scores_follow_the_consistent_reading() -> None:
    scorer = LoadAwareScorer("l", LoadAwareParams(), None)  # type: ignore[arg-type]
    pods = [
        ep("empty", waiting=0),
        ep("half", waiting=64),
        ep("full", waiting=128),
        ep("over", waiting=500),
    ]
    got = scorer.score(CycleState(), req(), pods)
    assert got == pytest.approx({"empty": 0.5, "half": 0.25, "full": 0.0, "over": 0.0})


def test_custom_threshold_and_independence_from_other_pods() -> None:
    scorer = LoadAwareScorer("l", LoadAwareParams(threshold=10), None)  # type: ignore[arg-type]
    alone = scorer.score(CycleState(), req(), [ep("a", waiting=2)])
    together = scorer.score(CycleState(), req(), [ep("a", waiting=2), ep("b", waiting=9)])
    assert alone["a"] == pytest.approx(0.4) == together["a"]
    assert together["b"] == pytest.approx(0.05)


def test_threshold_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        LoadAwareParams.model_validate({"threshold": 0})
    assert LoadAwareParams.model_validate({}).threshold == 128


def test_few_queues_or_many_score_alike() -> None:
    """Named sparsely (few queues) or in candidate order (many), each pod scores the rule."""
    scorer = LoadAwareScorer("l", LoadAwareParams(threshold=10), None)  # type: ignore[arg-type]
    for busy in (0.05, 0.5, 1.0):
        pods = [ep(f"p{i}", waiting=(i % 13 if i % 100 < busy * 100 else 0)) for i in range(400)]
        got = scorer.score(CycleState(), req(), pods)
        assert dict(got) == {
            e.name: 0.5 * (1.0 - min(float(e.metrics.waiting), 10.0) / 10.0) for e in pods
        }
