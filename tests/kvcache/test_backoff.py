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
    capped = Backoff(5.0, 5.0)
    assert capped.failed(0.0) == 5.0 and capped.capped_now  # a cap at the base: at once


def test_the_threshold_counts_from_when_the_next_attempt_was_due() -> None:
    # base 1, cap 8: after a failure at 0 the next attempt is due at 1; "long after" is
    # more than max(2 x 1, 8) + 1 = 9 s after that
    going_on = Backoff(1.0, 8.0)
    going_on.failed(0.0)
    assert going_on.failed(1.0 + 9.0) == 2.0 and going_on.failures == 2
    started_over = Backoff(1.0, 8.0)
    started_over.failed(0.0)
    assert started_over.failed(1.0 + 9.01) == 1.0 and started_over.failures == 1
