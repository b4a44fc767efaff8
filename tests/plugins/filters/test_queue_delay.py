"""The affinity filter's learned price of a pod's queue (queue_delay.py, queue_price.py)."""

from __future__ import annotations

import time

import pytest

from heimdall_proxy.plugins.filters.queue_delay import QueueDelay
from tests.plugins.filters.test_prefix_affinity import PODS, make, names, occupy, state
from tests.plugins.helpers import ctx, req, streamed


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


async def test_first_tokens_teach_the_filter_to_release_sooner() -> None:
    # At the prefill price (16,000 tokens/s) a warm pod two prompts busier than an idle cold
    # one stays sticky under a 200 ms margin; once first tokens showed each queued prompt
    # token costing 1 ms there, it is released.
    f = make(maxTTFTPenaltyMs=200)
    s = state({"a": 100.0})
    await occupy(f, 0, 2)
    assert names(f.filter(s, req(), PODS)) == ["a"]
    for i in range(6):  # streamed requests on "a" whose first token came 1.6 s after sending
        c = ctx(req(data={"stream": True, "j": i}), PODS[0], attempt=100 + i)
        c.state.update(state({}, 1600))
        await f.pre_request(c)
        waiting = f.queue_price._waiting
        pod, ahead, own, _ = waiting[c.key]
        waiting[c.key] = (
            pod, ahead, own, time.monotonic() - own - ahead * 1e-3,
        )  # fmt: skip
        await streamed(f, c, b'data: {"x":1}\n\n')
        await f.response_complete(c)
    assert f.queue_price.seconds_per_token("a") == pytest.approx(1e-3, rel=0.05)
    assert names(f.filter(s, req(), PODS)) == ["a", "b", "c"]


async def test_not_learned_when_turned_off_or_not_streamed() -> None:
    for f, data in ((make(learnQueueDelay=False), {"stream": True}), (make(), {})):
        await occupy(f, 0, 1)
        c = ctx(req(data=data), PODS[0], attempt=7)
        await f.pre_request(c)
        await streamed(f, c, b"data: {}\n\n")
        await f.response_complete(c)
        assert not f.queue_price.waiting
        assert f.queue_price.delay.seconds_per_token("a", -1.0) == -1.0
