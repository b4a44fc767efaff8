"""running-requests-size-scorer: inverted min-max over vllm:num_requests_running."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.scheduling.scorers.running_requests import (
    RUNNING_REQUESTS_SIZE_SCORER_TYPE,
    RunningRequestsSizeScorer,
)
from tests.helpers import ep


def score(endpoints: list[Endpoint]) -> dict[str, float]:
    scorer = RunningRequestsSizeScorer("r", NoParams(), None)  # type: ignore[arg-type]
    req = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})
    return dict(scorer.score(CycleState(), req, endpoints))


def test_type_name() -> None:
    assert RUNNING_REQUESTS_SIZE_SCORER_TYPE == "running-requests-size-scorer"


def test_min_max_exact_values() -> None:
    got = score([ep("a", running=2), ep("b", running=10), ep("c", running=4), ep("d", running=8)])
    assert got == pytest.approx({"a": 1.0, "b": 0.0, "c": 0.75, "d": 0.25})


def test_reads_running_not_waiting() -> None:
    got = score([ep("a", running=1, waiting=50), ep("b", running=3, waiting=0)])
    assert got == {"a": 1.0, "b": 0.0}


def test_all_equal_score_one() -> None:
    assert score([ep("a", running=5), ep("b", running=5)]) == {"a": 1.0, "b": 1.0}


def test_single_endpoint_scores_one() -> None:
    assert score([ep("a", running=9)]) == {"a": 1.0}
