"""The arithmetic of the learned queue price (queue_delay.py)."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.queue_delay import QueueDelay


def test_the_default_stands_until_enough_is_seen() -> None:
    q = QueueDelay(min_samples=3)
    q.observe("a", 1000.0, 0.5)
    q.observe("a", 0.0, 9.0)  # nothing ahead: says nothing about the queue
    assert q.seconds_per_token("a", 1e-4) == 1e-4
    q.observe("a", 1000.0, 0.5)
    q.observe("a", 3000.0, 1.5)
    assert q.seconds_per_token("a", 1e-4) == pytest.approx(5e-4)


def test_a_pod_without_its_own_samples_borrows_the_fleets() -> None:
    q = QueueDelay(min_samples=2)
    for _ in range(4):
        q.observe("a", 1000.0, 1.0)
    assert q.seconds_per_token("b", 1e-4) == pytest.approx(1e-3)
    for _ in range(4):
        q.observe("b", 1000.0, 3.0)
    assert q.seconds_per_token("b", 1e-4) == pytest.approx(3e-3)
    assert q.seconds_per_token("a", 1e-4) == pytest.approx(1e-3)


def test_recent_samples_weigh_most() -> None:
    q = QueueDelay(half_life=4.0, min_samples=1)
    for _ in range(40):
        q.observe("a", 1000.0, 0.1)
    for _ in range(40):
        q.observe("a", 1000.0, 1.0)
    assert q.seconds_per_token("a", 0.0) == pytest.approx(1e-3, rel=0.01)
