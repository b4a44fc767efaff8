"""utilization-detector and concurrency-detector: the saturation they report and the pods
they filter."""

from __future__ import annotations

import time

from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.types import CycleState, InferenceRequest
from heimdall_proxy.plugins.flowcontrol.saturation.concurrency import (
    ConcurrencyDetector,
    ConcurrencyDetectorParams,
)
from heimdall_proxy.plugins.flowcontrol.saturation.utilization import (
    UtilizationDetector,
    UtilizationDetectorParams,
)
from tests.helpers import ep

REQ = InferenceRequest("completions", "/v1/completions", "m", b"{}", {}, {})


def util(**params: object) -> UtilizationDetector:
    return UtilizationDetector(
        "u", UtilizationDetectorParams.model_validate(params), PluginHandle(EndpointPool([]))
    )


def fresh(name: str, **metrics: object):  # type: ignore[no-untyped-def]
    return ep(name, updated_at=time.monotonic(), **metrics)


def test_utilization_is_the_mean_of_each_pods_tightest_resource() -> None:
    d = util()
    pods = [fresh("a", waiting=5), fresh("b", kv_cache_usage=0.4)]
    assert d.saturation(pods) == (1.0 + 0.5) / 2
    assert d.saturation([fresh("a", waiting=10), fresh("b", waiting=5)]) >= 1.0


def test_utilization_counts_stale_or_unread_pods_as_full() -> None:
    d = util(metricsStalenessThreshold="100ms")
    old = ep("old", updated_at=time.monotonic() - 1.0)
    never = ep("never")
    assert d.saturation([old]) == 1.0 and d.saturation([never]) == 1.0
    assert d.saturation([]) == 1.0


def test_utilization_adds_requests_the_scrape_does_not_show_yet() -> None:
    d = util(queueDepthThreshold=2)
    pod = fresh("a", running=1)
    assert d.saturation([pod]) == 0.0
    for i in range(3):
        d.load.acquire(f"r{i}:0", "a", 10)
    assert d.saturation([pod]) == 1.0  # 3 in flight, the scrape shows 1: 2 more queued
    d.load.pending = 2
    assert d.saturation([pod]) == 2.0


def test_utilization_filter_drops_overfull_and_stale_pods_but_never_all() -> None:
    d = util(queueDepthThreshold=2, headroom=0.5)
    ok, full, stale = fresh("ok", waiting=3), fresh("full", waiting=4), ep("stale")
    assert d.filter(CycleState(), REQ, [ok, full, stale]) == [ok]
    assert d.filter(CycleState(), REQ, [full, stale]) == [full, stale]


def test_concurrency_modes() -> None:
    handle = PluginHandle(EndpointPool([]))
    pods = [ep("a"), ep("b")]
    by_req = ConcurrencyDetector("r", ConcurrencyDetectorParams(maxConcurrency=2), handle)
    hybrid = ConcurrencyDetector(
        "h",
        ConcurrencyDetectorParams(
            concurrencyMode="hybrid", maxConcurrency=2, maxTokenConcurrency=100
        ),
        handle,
    )
    handle.load.acquire("k2", "a", 150)
    assert by_req.saturation(pods) == 0.25
    assert hybrid.saturation(pods) == 0.75
    handle.load.acquire("k3", "a", 10)
    handle.load.pending = 2
    assert by_req.saturation(pods) == 1.0
    assert by_req.filter(CycleState(), REQ, pods) == [pods[1]]
    assert hybrid.filter(CycleState(), REQ, pods) == [pods[1]]
    handle.load.acquire("k4", "b", 1)
    handle.load.acquire("k5", "b", 1)
    assert by_req.filter(CycleState(), REQ, pods) == pods  # all over: keep all


def test_only_a_token_reading_detector_has_the_ledger_count_tokens() -> None:
    """The relay estimates prompt tokens for the ledger only when something reads them."""
    handle = PluginHandle(EndpointPool([]))
    ConcurrencyDetector("r", ConcurrencyDetectorParams(maxConcurrency=2), handle)
    assert handle.load.count_tokens is False
    ConcurrencyDetector("t", ConcurrencyDetectorParams(concurrencyMode="tokens"), handle)
    assert handle.load.count_tokens is True
