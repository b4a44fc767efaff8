"""Shared routing state on the real Redis (127.0.0.1:6379), one key namespace per test."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping

import pytest
import redis.asyncio as aioredis

from heimdall_proxy.replicas.connect import client
from heimdall_proxy.replicas.counters import ReplicaCounters
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


def counters(
    redis: aioredis.Redis, ns: str, local: Mapping[str, float], ttl: float = 5.0
) -> ReplicaCounters:
    # interval: a long one, the tests drive sync() themselves
    return ReplicaCounters(redis, ns, lambda: local, interval=60.0, ttl=ttl)


async def test_each_replica_sees_the_sum_of_the_others_counts(
    redis: aioredis.Redis, ns: str
) -> None:
    a_local = {"pod-0": 2.0, "pod-1": 1.0}
    b_local = {"pod-0": 3.0}
    c_local: dict[str, float] = {"pod-1": 0.5}
    a, b, c = (counters(redis, ns, x) for x in (a_local, b_local, c_local))
    for r in (a, b, c, a, b):
        await r.sync()
    assert a.others() == {"pod-0": 3.0, "pod-1": 0.5}
    assert b.others() == {"pod-0": 2.0, "pod-1": 1.5}
    # totals are republished whole: a count that went back to zero disappears
    a_local.clear()
    await a.sync()
    await b.sync()
    assert b.others() == {"pod-1": 0.5}


async def test_a_dead_replicas_counts_expire(redis: aioredis.Redis, ns: str) -> None:
    dead = counters(redis, ns, {"pod-0": 4.0}, ttl=0.3)
    live = counters(redis, ns, {}, ttl=0.3)
    await dead.sync()
    await live.sync()
    assert live.others() == {"pod-0": 4.0}
    # the dead replica never syncs again (killed: no clean stop withdrawing its counts)
    await asyncio.sleep(0.45)
    await live.sync()
    assert live.others() == {}
    assert await redis.exists(ns + "r:" + dead.replica) == 0
    assert await redis.zscore(ns + "replicas", dead.replica) is None


async def test_a_clean_stop_withdraws_counts_at_once(redis: aioredis.Redis, ns: str) -> None:
    leaving = counters(redis, ns, {"pod-0": 1.0})
    staying = counters(redis, ns, {})
    await leaving.start()
    await staying.sync()
    assert staying.others() == {"pod-0": 1.0}
    await leaving.stop()
    await staying.sync()
    assert staying.others() == {}


async def test_others_counts_are_dropped_when_redis_is_unreachable(
    redis: aioredis.Redis, ns: str
) -> None:
    other = counters(redis, ns, {"pod-0": 1.0}, ttl=0.2)
    await other.sync()
    # nothing listens on port 1: every tick fails
    lost = client("redis://127.0.0.1:1")
    try:
        me = ReplicaCounters(lost, ns, dict, interval=60.0, ttl=0.2)
        me._others = {"pod-0": 1.0}  # as pulled before the outage
        me._pulled = asyncio.get_running_loop().time()
        await me.start()  # logs, does not raise
        assert not me.reachable
        await asyncio.sleep(0.25)
        assert me.others() == {}
        await me.stop()
    finally:
        await lost.aclose()


async def test_journal_records_reach_the_other_replicas_and_late_starters(
    redis: aioredis.Redis, ns: str
) -> None:
    got_a: list[list[object]] = []
    got_b: list[list[object]] = []
    a = Journal(redis, ns + "j", got_a.append, interval=60.0, max_entries=1000)
    b = Journal(redis, ns + "j", got_b.append, interval=60.0, max_entries=1000)
    a.append(["pod-0", 7, b"\x00" * 8])
    a.append(["pod-1"])
    await a.sync()
    await b.sync()
    assert got_b == [["pod-0", 7, b"\x00" * 8], ["pod-1"]]
    assert got_a == []  # its own records were applied locally already
    b.append(["pod-2"])
    await b.sync()
    await a.sync()
    assert got_a == [["pod-2"]]
    # a replica starting later reads the history
    got_c: list[list[object]] = []
    c = Journal(redis, ns + "j", got_c.append, interval=60.0, max_entries=1000)
    await c.start()
    await c.stop()
    assert got_c == [["pod-0", 7, b"\x00" * 8], ["pod-1"], ["pod-2"]]


async def test_journal_history_is_bounded(redis: aioredis.Redis, ns: str) -> None:
    a = Journal(redis, ns + "j", lambda r: None, interval=60.0, max_entries=10)
    for i in range(500):
        a.append([f"pod-{i}"])
        await a.sync()
    # MAXLEN ~ trims whole macro nodes: bounded, though not exactly at 10
    assert await redis.xlen(ns + "j") < 200


#: A replica in its own process: publishes 3 requests in flight on pod-7 every 20 ms.
_REPLICA = """
import asyncio, sys
from heimdall_proxy.replicas.connect import client
from heimdall_proxy.replicas.counters import ReplicaCounters

async def main():
    c = ReplicaCounters(client(sys.argv[1]), sys.argv[2], lambda: {"pod-7": 3.0}, 0.02, 1.0)
    await c.start()
    print("up", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_killed_replica_process_stops_counting(redis: aioredis.Redis, ns: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _REPLICA, REDIS_URL, ns, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 20.0) == b"up\n"
        live = counters(redis, ns, {}, ttl=1.0)
        await live.sync()
        assert live.others() == {"pod-7": 3.0}
    finally:
        proc.kill()  # SIGKILL: no clean stop withdraws its counts
        await proc.wait()
    await asyncio.sleep(0.2)
    await live.sync()
    assert live.others() == {"pod-7": 3.0}  # not yet expired (time to live: 1 s)
    await asyncio.sleep(1.0)
    await live.sync()
    assert live.others() == {}
