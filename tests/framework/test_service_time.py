"""The time half of the learned queue cost (service_time.py): a pod's service time, and the
replay of its slots that says how long a request sent now would wait."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.service_time import ServiceTime, residual_wait


def test_a_free_slot_means_no_wait() -> None:
    assert residual_wait([0.4], 0, depth=1, service=1.0) == 0.0
    assert residual_wait([], 1, depth=1, service=1.0) == 0.0  # the queued one takes a slot


def test_full_slots_make_a_request_wait_for_the_first_to_finish() -> None:
    assert residual_wait([0.7, 0.2], 0, depth=1, service=1.0) == pytest.approx(0.2)


def test_the_queue_ahead_is_served_in_order() -> None:
    # two running (0.2 and 0.7 left), two queued ahead: they start at 0.2 and 0.7; the new
    # request starts when the first of those, started at 0.2, ends
    assert residual_wait([0.7, 0.2], 2, depth=1, service=1.0) == pytest.approx(1.2)


def test_more_running_than_the_depth_allows_queue_the_latest() -> None:
    # three seem to run on a one-slot pod: the two with most left are taken as queued
    assert residual_wait([0.3, 0.9, 0.6], 0, depth=0, service=1.0) == pytest.approx(2.3)


def test_the_service_time_is_learned_per_pod_and_borrowed_from_the_fleet() -> None:
    s = ServiceTime(min_samples=2)
    assert s.of("a") is None
    s.observe("a", 1.0)
    # one attempt ended anywhere: every pod borrows it (before, a full pod had no replay)
    assert s.of("a") == s.of("b") == pytest.approx(1.0)
    s.observe("a", 1.0)
    assert s.of("a") == pytest.approx(1.0)
    assert s.of("b") == pytest.approx(1.0)  # the fleet's
    s.observe("b", 3.0)
    s.observe("b", 3.0)
    assert s.of("b") == pytest.approx(3.0)
    s.forget("b")
    assert 1.0 < s.of("b") < 3.0  # the fleet's: both pods' samples, decayed
