"""kv-cache-utilization-scorer: 1 - usage."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.scheduling.scorers.kv_cache_utilization import (
    KV_CACHE_UTILIZATION_SCORER_TYPE,
    KVCacheUtilizationScorer,
)
from tests.helpers import ep


def score(endpoints: list[Endpoint]) -> dict[str, float]:
    scorer = KVCacheUtilizationScorer("kv", NoParams(), None)  # type: ignore[arg-type]
    req = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})
    return dict(scorer.score(CycleState(), req, endpoints))


def test_type_name() -> None:
    assert KV_CACHE_UTILIZATION_SCORER_TYPE == "kv-cache-utilization-scorer"


def test_score_is_one_minus_usage() -> None:
    got = score(
        [
            ep("a", kv_cache_usage=0.0),
            ep("b", kv_cache_usage=0.25),
            ep("c", kv_cache_usage=0.9),
            ep("d", kv_cache_usage=1.0),
        ]
    )
    assert got == pytest.approx({"a": 1.0, "b": 0.75, "c": 0.1, "d": 0.0})


def test_not_min_max_normalised() -> None:
    # Unlike queue-scorer, values are absolute: two similar pods keep similar scores.
    got = score([ep("a", kv_cache_usage=0.5), ep("b", kv_cache_usage=0.6)])
    assert got == pytest.approx({"a": 0.5, "b": 0.4})


def test_all_equal_and_single() -> None:
    assert score([ep("a", kv_cache_usage=0.3), ep("b", kv_cache_usage=0.3)]) == pytest.approx(
        {"a": 0.7, "b": 0.7}
    )
    assert score([ep("a", kv_cache_usage=0.3)]) == pytest.approx({"a": 0.7})


def test_out_of_range_usage_is_clamped() -> None:
    assert score([ep("a", kv_cache_usage=1.5), ep("b", kv_cache_usage=-0.5)]) == {
        "a": 0.0,
        "b": 1.0,
    }
