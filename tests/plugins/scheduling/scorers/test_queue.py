"""queue-scorer: inverted min-max over vllm:num_requests_waiting."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.scheduling.scorers.queue import QUEUE_SCORER_TYPE, QueueScorer
from tests.helpers import ep


def score(endpoints: list[Endpoint]) -> dict[str, float]:
    scorer = QueueScorer("q", NoParams(), None)  # type: ignore[arg-type]
    req = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})
    return dict(scorer.score(CycleState(), req, endpoints))


def test_type_name() -> None:
    assert QUEUE_SCORER_TYPE == "queue-scorer"
    assert QueueScorer.type == "queue-scorer"


def test_min_max_exact_values() -> None:
    got = score([ep("a", waiting=0), ep("b", waiting=5), ep("c", waiting=10), ep("d", waiting=2)])
    assert got == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.0, "d": 0.8})


def test_min_max_with_nonzero_minimum() -> None:
    got = score([ep("a", waiting=4), ep("b", waiting=7), ep("c", waiting=16)])
    assert got == pytest.approx({"a": 1.0, "b": 0.75, "c": 0.0})


def test_reads_waiting_not_running() -> None:
    got = score([ep("a", waiting=3, running=100), ep("b", waiting=1, running=0)])
    assert got == {"a": 0.0, "b": 1.0}


@pytest.mark.parametrize("value", [0, 7])
def test_all_equal_score_one(value: int) -> None:
    assert score([ep("a", waiting=value), ep("b", waiting=value), ep("c", waiting=value)]) == {
        "a": 1.0,
        "b": 1.0,
        "c": 1.0,
    }


def test_single_endpoint_scores_one() -> None:
    assert score([ep("a", waiting=42)]) == {"a": 1.0}


def test_no_endpoints() -> None:
    assert score([]) == {}
