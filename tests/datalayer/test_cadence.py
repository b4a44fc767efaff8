"""The scrape cadence: busy pods every interval, quiet pods backing off, woken by a send."""

from __future__ import annotations

import dataclasses

from heimdall_proxy.datalayer.cadence import ScrapeCadence, _vouched
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import Endpoint, Metrics
from tests.helpers import ep


def _scrape(cadence: ScrapeCadence, e: Endpoint, now: float, ok: bool = True) -> None:
    cadence.started(e.name, now)
    cadence.finished(e, ok, now)


def test_a_quiet_pod_backs_off_to_the_idle_interval() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pod = ep("a", updated_at=1.0)
    now, gaps = 0.0, []
    for _ in range(8):
        assert cadence.due([pod], now) == [pod]
        _scrape(cadence, pod, now)
        gaps.append(round(cadence.pod("a").due - now, 6))
        now = cadence.pod("a").due
    assert gaps == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_a_busy_or_failing_pod_keeps_the_interval() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    busy, failing = ep("busy", running=1, updated_at=1.0), ep("down", updated_at=1.0)
    for now in (0.0, 0.1, 0.2):
        assert cadence.due([busy, failing], now) == [busy, failing]
        _scrape(cadence, busy, now)
        _scrape(cadence, failing, now, ok=False)
        assert cadence.pod("busy").due == cadence.pod("down").due == now + 0.1


def test_a_send_wakes_a_quiet_pod_on_the_next_tick() -> None:
    load = InFlightLoad()
    cadence = ScrapeCadence(load, 0.1, 1.0)
    pod = ep("a", updated_at=1.0)
    for now in (0.0, 0.2, 0.6):
        _scrape(cadence, pod, now)
    assert cadence.pod("a").due == 1.4
    assert cadence.due([pod], 0.7) == []
    load.acquire("r:0", "a", 10)
    load.release("r:0")  # even a request already finished counts
    assert cadence.due([pod], 0.725) == [pod]
    _scrape(cadence, pod, 0.725)
    # Still empty after the request finished: quiet again, its back-off restarted.
    assert cadence.pod("a").due == 0.925


def test_in_flight_work_keeps_a_pod_busy_and_a_hop_wakes_it() -> None:
    load = InFlightLoad()
    cadence = ScrapeCadence(load, 0.1, 1.0)
    pod = ep("a", updated_at=1.0)
    load.acquire("r:0", "a", 1)
    _scrape(cadence, pod, 0.0)
    assert not cadence.pod("a").quiet
    load.release("r:0")
    _scrape(cadence, pod, 0.1)
    _scrape(cadence, pod, 0.3)
    assert cadence.pod("a").quiet
    load.acquire("r:0:prefill:a", "a", 5)  # a disaggregation hop counts like any request
    assert cadence.due([pod], 0.35) == [pod]


def test_a_quiet_pods_snapshot_is_vouched_for_between_scrapes() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pod = ep("a", updated_at=5.0)
    _scrape(cadence, pod, 5.0)
    assert cadence.due([pod], 5.1) == []
    assert pod.metrics.updated_at == 5.1
    busy = ep("b", waiting=2, updated_at=5.0)
    _scrape(cadence, busy, 5.0)
    assert cadence.due([busy], 5.05) == []
    assert busy.metrics.updated_at == 5.0  # a busy pod's age is its scrape's
    never = ep("c")
    never.metrics = Metrics()
    _scrape(cadence, never, 5.0)
    cadence.due([never], 5.1)
    assert never.metrics.updated_at == 0.0  # never scraped stays never scraped


def test_a_pod_that_left_and_came_back_starts_afresh() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pod = ep("a", updated_at=1.0)
    for now in (0.0, 0.2, 0.6):
        _scrape(cadence, pod, now)
    assert cadence.pod("a").interval > 0.1  # backed off while quiet
    cadence.forget("a")
    assert cadence.due([pod], 0.61) == [pod]  # due at once, at the base interval
    assert cadence.pod("a").interval == 0.1


def test_a_vouched_snapshot_is_the_old_one_taken_again() -> None:
    """_vouched builds the snapshot field by field: a field added to Metrics must not be
    dropped or shifted."""
    full = Metrics(3, 2, 0.5, ("a",), ("b",), 4, 16, 1000, 7.0)
    assert _vouched(full, 9.0) == dataclasses.replace(full, updated_at=9.0)
    assert [f.name for f in dataclasses.fields(Metrics)][-1] == "updated_at"


def test_a_quiet_pods_snapshot_is_taken_again_only_once_an_interval_old() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pod = ep("a", updated_at=5.0)
    _scrape(cadence, pod, 5.0)
    first = pod.metrics
    assert cadence.due([pod], 5.05) == []
    assert pod.metrics is first  # younger than an interval: left as it is
    assert cadence.due([pod], 5.125) == []
    assert pod.metrics.updated_at == 5.125
