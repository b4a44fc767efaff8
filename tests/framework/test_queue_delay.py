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


def test_counts_of_requests_ahead_that_delay_nobody_are_the_free_depth() -> None:
    # A two-slot pod: one request ahead never delays, two delay by about a reply.
    q = QueueDelay(min_samples=3)
    for _ in range(5):
        q.observe("a", 1000.0, 0.01, requests_ahead=1)
        q.observe("a", 2000.0, 0.4, requests_ahead=2)
    assert q.fit("a") == (
        0,
        pytest.approx(0.41 / 3000, rel=0.02),
        False,
        False,
    )  # no service time: depth 0
    fitted = q.fit("a", free_below=0.1)
    assert fitted is not None
    assert fitted.depth == 1 and fitted.replay  # two ahead were seen to delay
    assert fitted.bounded  # so the pod runs two at once
    # only the tokens beyond the free depth count: half of the 2000 with two ahead
    assert fitted.price == pytest.approx(0.4 / 1000, rel=0.02)


def test_a_pod_never_seen_to_delay_is_unbounded_and_priced() -> None:
    q = QueueDelay(min_samples=2)
    for k in range(1, 8):
        for _ in range(3):
            q.observe("big", 1000.0 * k, 0.001 * k, requests_ahead=k)
    fitted = q.fit("big", free_below=0.1)
    assert fitted is not None and not fitted.replay and not fitted.bounded
    assert fitted.depth == 7


def test_a_count_a_pod_has_not_seen_is_judged_by_the_fleet() -> None:
    q = QueueDelay(min_samples=3)
    for _ in range(4):
        q.observe("a", 1000.0, 0.0, requests_ahead=1)
        q.observe("a", 2000.0, 0.5, requests_ahead=2)
    for _ in range(4):
        q.observe("b", 2000.0, 0.5, requests_ahead=2)  # "b" never had just one ahead
    fitted = q.fit("b", free_below=0.1)
    assert fitted is not None and fitted.depth == 1 and fitted.replay


def test_the_replay_gives_way_when_the_price_foresaw_clearly_better() -> None:
    q = QueueDelay(min_samples=3)
    for _ in range(4):
        q.observe("a", 1000.0, 0.0, requests_ahead=1)
        q.observe("a", 2000.0, 0.5, requests_ahead=2)
    assert q.fit("a", free_below=0.1).replay  # type: ignore[union-attr]
    for _ in range(10):  # the replay foresaw 2 s each time; the price about 0.5 s
        q.observe("a", 2000.0, 0.5, requests_ahead=2, predicted=2.0)
    assert not q.fit("a", free_below=0.1).replay  # type: ignore[union-attr]
    # unless the pod's engine was seen full: it queues behind its slots, the replay's model
    known = q.fit("a", free_below=0.1, depth=1)
    assert known is not None and (known.depth, known.replay, known.bounded) == (1, True, True)


def test_an_older_replicas_sample_without_a_count_still_teaches_the_price() -> None:
    q = QueueDelay(min_samples=2)
    q.observe("a", 1000.0, 0.5)
    q.observe("a", 1000.0, 0.5)
    assert q.seconds_per_token("a", 0.0, free_below=0.1) == pytest.approx(5e-4)
