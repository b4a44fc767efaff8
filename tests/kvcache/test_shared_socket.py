"""Every pod on one shared SUB socket: each message goes to the pod its topic names, with
per-pod sequences, gaps replayed from that pod's own replay socket, and pods connected and
disconnected as they join and leave."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from heimdall_proxy.kvcache.events import BlockStored
from heimdall_proxy.kvcache.topics import TopicRoutes, endpoint_hostport, topic_ident
from tests.conftest import eventually
from tests.kvcache.test_subscriber import Pool, Sink, follow, pod
from tests.kvcache.vllm_wire import Publisher, batch, stored, until_live


def ev(n: int) -> bytes:
    return batch([stored([n], [n] * 16)])


def tokens_of(sink: Sink, name: str) -> list[int]:
    return [
        e.token_ids[0]
        for p, b in sink.batches
        if p == name
        for e in b.events
        if isinstance(e, BlockStored)
    ]


def test_a_topic_names_a_pod_by_name_address_or_its_own_host() -> None:
    routes = TopicRoutes()
    routes.add("a", "10.0.0.1", "10.0.0.1:8000", "tcp://10.0.0.1:5557")
    assert routes.pod_of(b"kv@whatever@m") == "a"  # one pod: every message is its own
    routes.add("b", "10.0.0.2", "10.0.0.2:8000", "tcp://10.0.0.2:5557")
    routes.add("c", "10.0.0.2", "10.0.0.2:8001", "tcp://10.0.0.2:6000")
    assert routes.pod_of(b"kv@a@m") == "a"
    assert routes.pod_of(b"kv@10.0.0.1@m") == "a"  # a host no other pod has
    assert routes.pod_of(b"kv@10.0.0.2@m") is None  # b and c share it
    assert routes.pod_of(b"kv@10.0.0.2:6000@m") == "c"  # c's publisher
    assert routes.pod_of(b"kv@10.0.0.2:8000@m") == "b"  # b's serving address
    assert routes.pod_of(b"kv@whatever@m") is None
    routes.remove("c")
    assert routes.pod_of(b"kv@10.0.0.2@m") == "b"  # now b's alone
    assert routes.pod_of(b"kv@10.0.0.2:6000@m") is None
    assert len(routes) == 2
    assert topic_ident(b"kv@x@org/model@v2") == "x" and topic_ident(b"plain") == "plain"
    assert endpoint_hostport("tcp://[::1]:5557") == "::1:5557"
    assert endpoint_hostport("ipc:///tmp/x") is None and endpoint_hostport("tcp://h") is None


async def test_pods_on_one_socket_are_told_apart_by_topic(ctx: zmq.asyncio.Context) -> None:
    named = Publisher(ctx, replay=True, topic="kv@a@m")
    addressed = Publisher(ctx, replay=True)
    addressed.topic = f"kv@127.0.0.1:{addressed.port}@m".encode()
    stranger = Publisher(ctx, replay=False, topic="kv@nobody@m")
    pool = Pool([pod("a", named.endpoint), pod("b", addressed.endpoint),
                 pod("c", stranger.endpoint)])  # fmt: skip
    sink = Sink()
    sub = await follow(pool, sink)
    try:
        assert sub._shared is not None  # one socket, three connections
        await until_live(named, sub.received, "a")
        await until_live(addressed, sub.received, "b")
        for _ in range(250):  # ZMQ's slow joiner: until the stranger is heard
            await stranger.publish(batch([]))
            if sub.stats.unattributed_batches:
                break
            await asyncio.sleep(0.02)
        await stranger.publish(ev(1))
        await named.publish(ev(10))
        await addressed.publish(ev(20))
        await addressed.publish(ev(21), send=False)  # b's gap, repaired from b's replay
        await named.publish(ev(11))
        await addressed.publish(ev(22))
        await eventually(lambda: 22 in tokens_of(sink, "b") and 11 in tokens_of(sink, "a"))
        assert tokens_of(sink, "a") == [10, 11]
        assert tokens_of(sink, "b") == [20, 21, 22]
        assert "c" not in sub.received  # its topic names nobody: never taken for a or b
        assert (sub.stats.gaps, sub.stats.replayed_batches) == (1, 1)
        assert named.replay_requests == []  # a had no gap
    finally:
        await sub.stop()
        for p in (named, addressed, stranger):
            await p.close()


async def test_a_pod_that_leaves_is_disconnected_and_one_that_joins_connected(
    ctx: zmq.asyncio.Context,
) -> None:
    first = Publisher(ctx, replay=False, topic="kv@a@m")
    second = Publisher(ctx, replay=False, topic="kv@b@m")
    pool = Pool([pod("a", first.endpoint)])
    sink = Sink()
    sub = await follow(pool, sink, reconcile_interval=0.05)
    try:
        await until_live(first, sub.received, "a")
        pool.list = [pod("b", second.endpoint)]
        await until_live(second, sub.received, "b")
        assert "a" in sink.forgotten and sub.subscriptions() == {"b": second.endpoint}
        before = sub.received.get("a", 0)
        await first.publish(ev(1))
        await second.publish(ev(2))
        await eventually(lambda: 2 in tokens_of(sink, "b"))
        assert sub.received.get("a", 0) == before and not tokens_of(sink, "a")
    finally:
        await sub.stop()
        await first.close()
        await second.close()


@pytest.mark.parametrize("catch_up", [True, False])
async def test_a_gap_of_one_pod_does_not_touch_another(
    ctx: zmq.asyncio.Context, catch_up: bool
) -> None:
    a = Publisher(ctx, replay=True, topic="kv@a@m")
    b = Publisher(ctx, replay=True, topic="kv@b@m")
    sink = Sink()
    sub = await follow(Pool([pod("a", a.endpoint), pod("b", b.endpoint)]), sink,
                       catch_up=catch_up)  # fmt: skip
    try:
        await until_live(a, sub.received, "a")
        await until_live(b, sub.received, "b")
        await a.publish(ev(1))
        await b.publish(ev(5), send=False)
        await b.publish(ev(6))
        await a.publish(ev(2))
        await eventually(lambda: 6 in tokens_of(sink, "b") and 2 in tokens_of(sink, "a"))
        assert tokens_of(sink, "a") == [1, 2] and tokens_of(sink, "b") == [5, 6]
        assert sub.stats.gaps == 1 and sub.stats.missed_batches == 0
    finally:
        await sub.stop()
        await a.close()
        await b.close()


async def test_a_pod_waiting_on_its_replay_holds_back_no_other(ctx: zmq.asyncio.Context) -> None:
    slow = Publisher(ctx, replay=False, topic="kv@a@m")  # its replay never answers
    quick = Publisher(ctx, replay=False, topic="kv@b@m")
    sink = Sink()
    pool = Pool([pod("a", slow.endpoint), pod("b", quick.endpoint)])
    sub = await follow(pool, sink, replay_timeout=0.5)
    try:
        await until_live(slow, sub.received, "a")
        await until_live(quick, sub.received, "b")
        await slow.publish(ev(1))
        await slow.publish(ev(2), send=False)
        await slow.publish(ev(3))  # a gap: a's replay is asked, and waited for
        await eventually(lambda: sub.stats.gaps == 1)
        await quick.publish(ev(5))
        await eventually(lambda: 3 in tokens_of(sink, "a") and 5 in tokens_of(sink, "b"))
        order = [e.token_ids[0] for _, b in sink.batches for e in b.events
                 if isinstance(e, BlockStored)]  # fmt: skip
        assert order.index(5) < order.index(3)  # b's batch went by while a's waited
        assert tokens_of(sink, "a") == [1, 3] and sub.stats.missed_batches == 1
    finally:
        await sub.stop()
        await slow.close()
        await quick.close()


async def test_a_pod_that_moves_is_followed_at_its_new_address(ctx: zmq.asyncio.Context) -> None:
    old = Publisher(ctx, replay=False, topic="kv@a@m")
    new = Publisher(ctx, replay=False, topic="kv@a@m")
    other = Publisher(ctx, replay=False, topic="kv@b@m")
    pool = Pool([pod("a", old.endpoint), pod("b", other.endpoint)])
    sink = Sink()
    sub = await follow(pool, sink, reconcile_interval=0.05)
    try:
        await until_live(old, sub.received, "a")
        pool.list = [pod("a", new.endpoint), pod("b", other.endpoint)]
        await eventually(lambda: sub.subscriptions().get("a") == new.endpoint)
        sub.received.pop("a", None)
        await until_live(new, sub.received, "a")  # heard at its new address
        await new.publish(ev(9))
        await eventually(lambda: 9 in tokens_of(sink, "a"))
    finally:
        await sub.stop()
        for p in (old, new, other):
            await p.close()
