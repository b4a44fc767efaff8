"""The scrape cadence: busy pods every interval, quiet pods backing off onto a grid, their
snapshots held until a send wakes them."""

from __future__ import annotations

import dataclasses

import pytest

from heimdall_proxy.datalayer.cadence import ScrapeCadence, _stamped
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import Endpoint, Metrics
from tests.helpers import ep


def _scrape(cadence: ScrapeCadence, e: Endpoint, now: float, ok: bool = True) -> None:
    cadence.started(e.name, now)
    cadence.finished(e, ok, now)


def test_a_quiet_pod_backs_off_to_the_idle_interval_on_the_grid() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    assert cadence.grid == 0.25
    pod = ep("a", updated_at=1.0)
    now, gaps = 0.0, []
    for _ in range(8):
        assert cadence.due([pod], now) == [pod]
        _scrape(cadence, pod, now)
        gaps.append(round(cadence.pod("a").due - now, 6))
        now = cadence.pod("a").due
    # 0.8 from 0.6 is 1.4, rounded down to the grid: 1.25; from there on whole seconds.
    assert gaps == [0.2, 0.4, 0.65, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert now == 6.25


def test_a_scrape_started_a_hair_early_keeps_the_whole_interval() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pod = ep("a", updated_at=1.0)
    for now in (0.0, 0.2, 0.6):
        _scrape(cadence, pod, now)
    assert cadence.pod("a").due == 1.25
    _scrape(cadence, pod, 1.249)  # its pass ran a millisecond before the grid point
    assert cadence.pod("a").due == 2.25  # not 2.0: the period stays the idle interval
    assert cadence.on_grid(3.2, 1.0) == 3.0  # later than a grid point: rounded down


def test_quiet_pods_fall_onto_one_grid_whatever_their_phase() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pods = [ep(f"p{i}", updated_at=1.0) for i in range(7)]
    for i, pod in enumerate(pods):
        now = 0.013 * i
        for _ in range(4):  # 0.2, 0.4, 0.8, then the idle interval
            _scrape(cadence, pod, now)
            now = cadence.pod(pod.name).due
    dues = {cadence.pod(p.name).due for p in pods}
    assert all(round(d / 0.25, 9).is_integer() for d in dues)
    assert len(dues) <= 2  # seven phases, at most two wake-ups
    assert cadence.due(pods, 0.0) == []
    assert cadence.next_due == min(dues)


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
    assert cadence.pod("a").due == 1.25
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


def test_a_quiet_pods_snapshot_is_held_between_scrapes() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pod = ep("a", updated_at=5.0)
    _scrape(cadence, pod, 5.0)
    held = pod.metrics
    assert held.held and held.updated_at == 5.0 and held.age(9.0) == 0.0
    assert cadence.due([pod], 5.15) == []  # due at 5.2
    assert pod.metrics is held  # nothing renews it: no pass has to run for it
    busy = ep("b", waiting=2, updated_at=5.0)
    _scrape(cadence, busy, 5.0)
    assert not busy.metrics.held and busy.metrics.age(5.5) == 0.5  # its scrape's age
    never = ep("c")
    never.metrics = Metrics()
    _scrape(cadence, never, 5.0)
    assert not never.metrics.held and never.metrics.age() == float("inf")


def test_a_send_ends_the_hold_before_the_request_goes() -> None:
    load = InFlightLoad()
    cadence = ScrapeCadence(load, 0.1, 1.0)
    pod = ep("a", updated_at=5.0)
    _scrape(cadence, pod, 5.0)
    assert cadence.is_quiet("a")
    cadence.wake(pod, 5.7)  # what the refresher's send listener does
    assert not pod.metrics.held and pod.metrics.updated_at == 5.7
    assert pod.metrics.age(5.8) == pytest.approx(0.1)  # ages from the send on
    assert not cadence.is_quiet("a") and cadence.due([pod], 5.7) == [pod]
    # A send nobody woke it for (another replica's, noticed on the next pass): the same.
    _scrape(cadence, pod, 6.0)
    assert pod.metrics.held
    load.acquire("r:1", "a")
    assert cadence.due([pod], 6.1) == [pod]
    assert not pod.metrics.held and pod.metrics.updated_at == 6.1


def test_a_held_pod_whose_scrape_fails_ages_from_that_scrape() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pod = ep("a", updated_at=5.0)
    _scrape(cadence, pod, 5.0)
    cadence.started("a", 6.0)
    cadence.finished(pod, False, 6.3)
    assert not pod.metrics.held and pod.metrics.updated_at == 6.0
    assert cadence.pod("a").due == pytest.approx(6.1)


def test_a_pod_that_left_and_came_back_starts_afresh() -> None:
    cadence = ScrapeCadence(InFlightLoad(), 0.1, 1.0)
    pod = ep("a", updated_at=1.0)
    for now in (0.0, 0.2, 0.6):
        _scrape(cadence, pod, now)
    assert cadence.pod("a").interval > 0.1  # backed off while quiet
    cadence.forget("a")
    assert cadence.due([pod], 0.61) == [pod]  # due at once, at the base interval
    assert cadence.pod("a").interval == 0.1


def test_a_stamped_snapshot_is_the_old_one_taken_again() -> None:
    """_stamped builds the snapshot field by field: a field added to Metrics must not be
    dropped or shifted."""
    full = Metrics(3, 2, 0.5, ("a",), ("b",), 4, 16, 1000, 7.0)
    assert _stamped(full, 9.0, True) == dataclasses.replace(full, updated_at=9.0, held=True)
    assert [f.name for f in dataclasses.fields(Metrics)][-2:] == ["updated_at", "held"]
