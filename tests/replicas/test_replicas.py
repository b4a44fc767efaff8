"""Shared routing state on the real Redis (127.0.0.1:6379), one key namespace per test.

Each replica is a SyncHub of its own (in the gateway, one per process and store), so two
hubs in this process are two replicas."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Mapping

import msgpack
import pytest
import redis.asyncio as aioredis

from heimdall_proxy.replicas import hub as hubs
from heimdall_proxy.replicas.connect import client
from heimdall_proxy.replicas.counters import ReplicaCounters
from heimdall_proxy.replicas.hub import LISTEN_POLL, SyncHub
from heimdall_proxy.replicas.journal import Journal
from tests.kvcache.redisns import REDIS_URL, redis_namespace


@pytest.fixture
async def ns() -> AsyncIterator[str]:
    async with redis_namespace() as prefix:
        yield prefix


@pytest.fixture
async def redis() -> AsyncIterator[aioredis.Redis]:
    c = client(REDIS_URL)
    try:
        yield c
    finally:
        await c.aclose()


@contextlib.asynccontextmanager
async def replica(
    *parts: ReplicaCounters | Journal, address: str = REDIS_URL
) -> AsyncIterator[SyncHub]:
    """A replica: its own hub with `parts` in it, no background loop (the tests sync)."""
    hub = SyncHub(address, background=False)
    try:
        for part in parts:
            await hub.add(part)
        yield hub
    finally:
        for part in parts:
            if part.hub is hub:
                await hub.remove(part)
        await hub.stop()


@contextlib.asynccontextmanager
async def listening(
    a: ReplicaCounters | Journal, b: ReplicaCounters | Journal
) -> AsyncIterator[tuple[SyncHub, SyncHub]]:
    """Two replicas with background hubs (listeners on), `b`'s subscribed before the test
    goes on; their own ticks are a minute apart (the parts' interval)."""
    ha, hb = SyncHub(REDIS_URL), SyncHub(REDIS_URL)
    try:
        await hb.add(b)
        await ha.add(a)
        await asyncio.sleep(LISTEN_POLL * 2)  # b's listener has subscribed
        yield ha, hb
    finally:
        await ha.remove(a)
        await hb.remove(b)
        await ha.stop()
        await hb.stop()


def counters(ns: str, local: Mapping[str, float], ttl: float = 5.0) -> ReplicaCounters:
    # interval: a long one, the tests drive sync() themselves
    return ReplicaCounters(REDIS_URL, ns, lambda: local, interval=60.0, ttl=ttl)


def journal(ns: str, got: list[list[object]], max_entries: int = 1000) -> Journal:
    return Journal(REDIS_URL, ns + "j", got.append, interval=60.0, max_entries=max_entries)


async def test_each_replica_sees_the_sum_of_the_others_counts(ns: str) -> None:
    a_local = {"pod-0": 2.0, "pod-1": 1.0}
    b_local = {"pod-0": 3.0}
    c_local: dict[str, float] = {"pod-1": 0.5}
    a, b, c = (counters(ns, x) for x in (a_local, b_local, c_local))
    async with replica(a) as ha, replica(b) as hb, replica(c) as hc:
        for h in (ha, hb, hc, ha, hb):
            await h.sync()
        assert a.others() == {"pod-0": 3.0, "pod-1": 0.5}
        assert b.others() == {"pod-0": 2.0, "pod-1": 1.5}
        # totals are republished whole: a count that went back to zero disappears
        a_local.clear()
        await ha.sync()
        await hb.sync()
        assert b.others() == {"pod-1": 0.5}


@pytest.mark.slow
async def test_a_dead_replicas_counts_expire(redis: aioredis.Redis, ns: str) -> None:
    dead = counters(ns, {"pod-0": 4.0}, ttl=0.3)
    live = counters(ns, {}, ttl=0.3)
    async with replica(live) as hl:
        hd = SyncHub(REDIS_URL, background=False)
        await hd.add(dead)  # publishes once
        await hl.sync()
        assert live.others() == {"pod-0": 4.0}
        # the dead replica never syncs again (killed: no clean stop withdrawing its counts)
        await hd.stop()
        await asyncio.sleep(0.45)
        await hl.sync()
        assert live.others() == {}
    assert await redis.exists(ns + "r:" + dead.replica) == 0
    assert await redis.zscore(ns + "replicas", dead.replica) is None


async def test_a_clean_stop_withdraws_counts_at_once(ns: str) -> None:
    leaving = counters(ns, {"pod-0": 1.0})
    staying = counters(ns, {})
    async with replica(staying) as hs:
        async with replica(leaving):
            await hs.sync()
            assert staying.others() == {"pod-0": 1.0}
        await hs.sync()
        assert staying.others() == {}


async def test_others_counts_are_dropped_when_redis_is_unreachable(ns: str) -> None:
    other = counters(ns, {"pod-0": 1.0}, ttl=0.2)
    async with replica(other):
        # nothing listens on port 1: every tick fails
        me = ReplicaCounters("redis://127.0.0.1:1", ns, dict, interval=60.0, ttl=0.2)
        me._others = {"pod-0": 1.0}  # as pulled before the outage
        me._pulled = asyncio.get_running_loop().time()
        async with replica(me, address="redis://127.0.0.1:1"):  # logs, does not raise
            assert not me.reachable
            await asyncio.sleep(0.25)
            assert me.others() == {}


async def test_journal_records_reach_the_other_replicas_and_late_starters(ns: str) -> None:
    got_a: list[list[object]] = []
    got_b: list[list[object]] = []
    a, b = journal(ns, got_a), journal(ns, got_b)
    async with replica(a) as ha, replica(b) as hb:
        a.append(["pod-0", 7, b"\x00" * 8])
        a.append(["pod-1"])
        await ha.sync()
        await hb.sync()
        assert got_b == [["pod-0", 7, b"\x00" * 8], ["pod-1"]]
        assert got_a == []  # its own records were applied locally already
        b.append(["pod-2"])
        await hb.sync()
        await ha.sync()
        assert got_a == [["pod-2"]]
    # a replica starting later reads the history
    got_c: list[list[object]] = []
    async with replica(journal(ns, got_c)):
        pass
    assert got_c == [["pod-0", 7, b"\x00" * 8], ["pod-1"], ["pod-2"]]


async def test_a_stopping_journal_sends_its_last_records(ns: str) -> None:
    got_b: list[list[object]] = []
    a, b = journal(ns, []), journal(ns, got_b)
    async with replica(b) as hb:
        async with replica(a):
            a.append(["pod-3"])  # no tick before the stop
        await hb.sync()
    assert got_b == [["pod-3"]]


async def test_journal_history_is_bounded(redis: aioredis.Redis, ns: str) -> None:
    a = journal(ns, [], max_entries=10)
    async with replica(a) as ha:
        for i in range(500):
            a.append([f"pod-{i}"])
            await ha.sync()
    # MAXLEN ~ trims whole macro nodes: bounded, though not exactly at 10
    assert await redis.xlen(ns + "j") < 200


async def test_one_round_trip_carries_every_plugins_state(ns: str) -> None:
    """Two plugins' counters and two journals in one hub per replica: one tick of each
    replica moves all of it (one script call, the XADDs and one XREAD per tick)."""
    got: dict[str, list[list[object]]] = {k: [] for k in ("a1", "a2", "b1", "b2")}
    a1 = counters(ns + "c1:", {"pod-0": 2.0})
    a2 = counters(ns + "c2:", {"pod-1": 5.0})
    b1 = counters(ns + "c1:", {"pod-0": 1.0})
    b2 = counters(ns + "c2:", {})
    ja1 = Journal(REDIS_URL, ns + "j1", got["a1"].append, 60.0, 1000)
    ja2 = Journal(REDIS_URL, ns + "j2", got["a2"].append, 60.0, 1000)
    jb1 = Journal(REDIS_URL, ns + "j1", got["b1"].append, 60.0, 1000)
    jb2 = Journal(REDIS_URL, ns + "j2", got["b2"].append, 60.0, 1000)
    async with replica(a1, a2, ja1, ja2) as ha, replica(b1, b2, jb1, jb2) as hb:
        ja1.append(["x"])
        ja2.append(["y"])
        jb2.append(["z"])
        await ha.sync()
        await hb.sync()
        await ha.sync()
        assert (b1.others(), b2.others()) == ({"pod-0": 2.0}, {"pod-1": 5.0})
        assert (a1.others(), a2.others()) == ({"pod-0": 1.0}, {})
        assert got == {"a1": [], "a2": [["z"]], "b1": [["x"]], "b2": [["y"]]}


async def test_the_script_is_reloaded_when_the_server_lost_it(
    redis: aioredis.Redis, ns: str
) -> None:
    a, b = counters(ns, {"pod-0": 1.0}), counters(ns, {})
    async with replica(a), replica(b) as hb:
        await redis.script_flush()
        await hb.sync()  # NOSCRIPT: loaded again, and the tick still completes
        assert b.others() == {"pod-0": 1.0}


async def test_the_plugins_of_one_process_share_one_hub(ns: str) -> None:
    """The registry: parts naming the same store join one hub; the last one out stops it."""
    c = counters(ns, {"pod-0": 1.0})
    j = journal(ns, [])
    await hubs.join(c)
    await hubs.join(j)
    try:
        assert c.hub is not None and c.hub is j.hub
        assert c.hub.parts == [c, j]
    finally:
        hub = c.hub
        await hubs.leave(c)
        assert hub is not None and hub.users == 1 and j.hub is hub
        await hubs.leave(j)
    assert hub.users == 0 and j.hub is None


#: A replica in its own process: publishes 3 requests in flight on pod-7 every 20 ms.
_REPLICA = """
import asyncio, sys
from heimdall_proxy.replicas import hub
from heimdall_proxy.replicas.counters import ReplicaCounters

async def main():
    c = ReplicaCounters(sys.argv[1], sys.argv[2], lambda: {"pod-7": 3.0}, 0.02, 1.0)
    await hub.join(c)
    print("up", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_killed_replica_process_stops_counting(ns: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _REPLICA, REDIS_URL, ns, stdout=asyncio.subprocess.PIPE
    )
    live = counters(ns, {}, ttl=1.0)
    async with replica(live) as hl:
        try:
            assert proc.stdout is not None
            assert await asyncio.wait_for(proc.stdout.readline(), 20.0) == b"up\n"
            await hl.sync()
            assert live.others() == {"pod-7": 3.0}
        finally:
            proc.kill()  # SIGKILL: no clean stop withdraws its counts
            await proc.wait()
        await asyncio.sleep(0.2)
        await hl.sync()
        assert live.others() == {"pod-7": 3.0}  # not yet expired (time to live: 1 s)
        await asyncio.sleep(1.0)
        await hl.sync()
        assert live.others() == {}


@pytest.mark.slow
async def test_new_journal_records_make_the_others_tick(ns: str) -> None:
    """Both hubs tick only every 60 s on their own: b gets a's record only because a's tick
    announced it and b's listener ticked."""
    got: list[list[object]] = []
    a, b = journal(ns, []), journal(ns, got)
    async with listening(a, b):
        a.append(["x"])
        async with asyncio.timeout(10.0):
            while got != [["x"]]:  # noqa: ASYNC110 - state of another task
                await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_counts_are_pushed_to_the_others_without_a_tick_of_theirs(ns: str) -> None:
    """b's hub is kept from ticking (its lock held, its interval 60 s): a's new count still
    reaches b, carried by the notification itself."""
    a_local: dict[str, float] = {}
    a, b = counters(ns, a_local), counters(ns, {})
    async with listening(a, b) as (_, hb):
        assert b.others() == {}
        async with hb._lock:  # no tick of b's can run
            a_local["pod-0"] = 2.0
            a.changed()
            async with asyncio.timeout(10.0):
                while b.others() != {"pod-0": 2.0}:  # noqa: ASYNC110 - state of another task
                    await asyncio.sleep(0.01)


async def test_a_pull_read_before_a_push_does_not_roll_it_back(ns: str) -> None:
    a_local = {"pod-0": 2.0}
    a, b = counters(ns, a_local), counters(ns, {})
    async with replica(a) as ha, replica(b) as hb:
        await ha.sync()  # written: 2
        a_local["pod-0"] = 5.0
        a.script_args()  # a newer set of totals, pushed but not (yet) written
        assert b.pushed(a.push_message())
        assert b.others() == {"pod-0": 5.0}
        await hb.sync()  # reads the older hash
        assert b.others() == {"pod-0": 5.0}
        a_local["pod-0"] = 7.0
        await ha.sync()
        await hb.sync()
        assert b.others() == {"pod-0": 7.0}


def test_a_bare_notification_is_not_taken_for_a_push(ns: str) -> None:
    """An older replica announces a tick with its hub id only: the hub ticks instead."""
    assert not counters(ns, {}).pushed(b"0123456789abcdef")


class Events:
    """A rider recording what it receives and sending what it is given."""

    def __init__(self) -> None:
        self.out: list[object] = []
        self.got: list[object] = []

    def outgoing(self) -> object:
        out, self.out = self.out, []
        return out or None

    def incoming(self, payload: object) -> None:
        if not isinstance(payload, list):
            raise TypeError("not a list")
        self.got.append(payload)


@pytest.mark.slow
async def test_a_riders_events_go_with_the_push(ns: str) -> None:
    """b's hub never ticks (lock held, 60 s interval): a's events reach b's rider in the
    push that carries a's totals."""
    a_local: dict[str, float] = {}
    a, b = counters(ns, a_local), counters(ns, {})
    a.rider, b.rider = Events(), Events()
    async with listening(a, b) as (_, hb), hb._lock:
        a_local["pod-0"] = 1.0
        a.rider.out = [1, None, 2]
        a.changed()
        async with asyncio.timeout(10.0):
            while not b.rider.got:  # noqa: ASYNC110 - state of another task
                await asyncio.sleep(0.01)
        assert b.rider.got == [[1, None, 2]]
        assert b.others() == {"pod-0": 1.0}
        assert a.rider.got == []  # its own push is not applied to itself


async def test_a_push_carries_a_riders_events_once_and_whatever_its_sequence(ns: str) -> None:
    a_local = {"pod-0": 2.0}
    a, b = counters(ns, a_local), counters(ns, {})
    a.rider, b.rider = Events(), Events()
    async with replica(a), replica(b):
        a_local["pod-0"] = 3.0
        a.script_args()
        a.rider.out = [5]
        first = a.push_message()
        assert a.push_message() != first  # a retried tick's push: the events went in the first
        assert b.pushed(first)
        assert b.pushed(first)  # the same totals again: not newer, but the events count
        assert b.rider.got == [[5], [5]]
        assert b.others() == {"pod-0": 3.0}


async def test_a_bad_rider_payload_is_dropped_and_the_totals_taken(ns: str) -> None:
    a_local = {"pod-0": 2.0}
    a, b = counters(ns, a_local), counters(ns, {})
    b.rider = Events()
    async with replica(a), replica(b):
        a_local["pod-0"] = 3.0
        a.script_args()  # newer totals than b pulled when it joined
        assert b.pushed(msgpack.packb([a.replica, a._sent, "not a list"]))
        assert b.rider.got == []
        assert b.others() == {"pod-0": 3.0}
        for bad in (msgpack.packb([[1], [], 1]), msgpack.packb(7), msgpack.packb(["r", 5])):
            assert not b.pushed(bad)
