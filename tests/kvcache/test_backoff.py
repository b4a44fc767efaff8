"""Backoff: the waits of a run of failures, where it reaches its cap, when it starts over."""

from __future__ import annotations

from heimdall_proxy.kvcache.backoff import Backoff


def test_waits_double_to_the_cap_which_is_said_once() -> None:
    run = Backoff(1.0, 8.0, "tcp://a:1")
    now = 100.0
    waits, capped = [], []
    for _ in range(6):
        wait = run.failed(now)
        waits.append(wait)
        capped.append(run.capped_now)
        now += wait  # the next attempt fails as soon as it is made
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert capped == [False, False, False, True, False, False]
    assert run.failures == 6


def test_a_failure_long_after_the_last_starts_a_new_run() -> None:
    run = Backoff(1.0, 8.0)
    t = 0.0
    for _ in range(3):
        t += run.failed(t)
    assert run.failures == 3
    # the attempt at t held (no failure) for far longer than its wait: it had recovered
    assert run.failed(t + 60.0) == 1.0 and run.failures == 1
    assert Backoff(5.0, 5.0).failed(0.0) == 5.0  # a cap at the base: capped at once
