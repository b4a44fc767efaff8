"""The tiered responses-store backend against the real Redis on this machine (a unique key
prefix and stream per test, removed afterwards).

No MongoDB server can run here, so the Redis-stream -> MongoDB sync is tested with a fake
MongoDB tier injected in its place (FakeMongo: records writes, can be made "down"); what is
under test is the stream consumer's read / claim / acknowledge / retry logic, on real Redis.
The MongoStore itself is tested against a real MongoDB only when MONGODB_URI is set."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from heimdall_proxy.plugins.store.params import MongoConfig, RedisConfig, StreamConfig, TieredConfig
from heimdall_proxy.plugins.store.tiered import (
    MongoStore,
    RedisTarget,
    StreamSyncer,
    SyncOp,
    TieredBackend,
    encode_op,
    redis_target,
)
from tests.conftest import eventually

REDIS_URL = "redis://127.0.0.1:6379"


class FakeMongo:
    """Stands in for the MongoDB tier (no MongoDB server can run on this machine)."""

    def __init__(self) -> None:
        self.docs: dict[str, bytes] = {}
        self.batches: list[list[SyncOp]] = []
        self.down = False
        self.attempts = 0
        self.gate: asyncio.Event | None = None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def write(self, ops: Sequence[SyncOp]) -> None:
        self.attempts += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise ConnectionError("mongo is down")
        for op in ops:
            if op.op == "put":
                self.docs[op.response_id] = op.entry
            else:
                self.docs.pop(op.response_id, None)
        self.batches.append(list(ops))

    async def get(self, response_id: str) -> bytes | None:
        if self.down:
            raise ConnectionError("mongo is down")
        return self.docs.get(response_id)


@pytest.fixture
async def redis() -> AsyncIterator[Any]:
    from redis.asyncio import Redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    client = Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except (RedisConnectionError, OSError):
        await client.aclose()
        pytest.skip(f"no Redis at {REDIS_URL}")
    yield client
    await client.aclose()


@pytest.fixture
async def ns(redis: Any) -> AsyncIterator[str]:
    """A key namespace for one test; every key under it is deleted afterwards."""
    prefix = f"heimdall-test:{uuid.uuid4().hex}:"
    yield prefix
    keys = [key async for key in redis.scan_iter(match=f"{prefix}*")]
    if keys:
        await redis.delete(*keys)


def tiered(ns: str, mongo: bool = True, **redis: Any) -> TieredConfig:
    doc: dict[str, Any] = {
        "redis": {"address": REDIS_URL, **redis},
        "stream": {
            "key": f"{ns}stream",
            "consumerGroup": "sync",
            "blockTimeout": "50ms",
            "claimAge": "100ms",
        },
    }
    if mongo:
        doc["mongo"] = {"uri": "mongodb://unused.invalid"}
    return TieredConfig.model_validate(doc)


async def pending(redis: Any, ns: str) -> int:
    info = await redis.xpending(f"{ns}stream", "sync")
    return int(info["pending"])


# ---- addresses -----------------------------------------------------------------------


def test_redis_targets() -> None:
    def target(**kw: Any) -> Any:
        return redis_target(RedisConfig.model_validate(kw))

    assert target(address="valkey://h:1/2").url == "redis://h:1/2"
    assert target(address="valkeys://h:1").url == "rediss://h:1"
    assert target(address="h:7000").url == "redis://h:7000"
    assert target(addresses=["h:7000"]).url == "redis://h:7000"
    sentinel = target(addresses=["s1:26379", "[::1]:26380"], masterName="mymaster")
    assert (sentinel.mode, sentinel.nodes) == ("sentinel", (("s1", 26379), ("::1", 26380)))
    cluster = target(addresses=["a:7000", "b:7001"])
    assert (cluster.mode, cluster.nodes) == ("cluster", (("a", 7000), ("b", 7001)))
    with pytest.raises(ValueError, match="Cluster"):
        target(addresses=["a:7000", "b:7001"], db=1)
    with pytest.raises(ValueError, match="masterName needs"):
        target(address="redis://h", masterName="m")


# ---- tier 1 ------------------------------------------------------------------------------


async def test_redis_put_get_delete_with_ttl(redis: Any, ns: str) -> None:
    backend = TieredBackend(tiered(ns, mongo=False, ttl="2s"), key_prefix=ns, redis=redis)
    await backend.start()
    try:
        await backend.put("r1", b'{"x":1}')
        assert await backend.get("r1") == b'{"x":1}'
        assert 0 < await redis.pttl(f"{ns}r1") <= 2000
        assert await redis.exists(f"{ns}stream") == 0  # no MongoDB tier: no stream
        assert await backend.delete("r1") is True
        assert await backend.delete("r1") is False
        assert await backend.get("r1") is None
    finally:
        await backend.stop()


async def test_backend_connects_from_its_parameters(redis: Any, ns: str) -> None:
    cfg = tiered(ns, mongo=False, ttl="0", db=0)
    backend = TieredBackend(cfg, key_prefix=ns)
    await backend.start()
    try:
        await backend.put("r1", b"{}")
        assert await redis.pttl(f"{ns}r1") == -1  # ttl 0: no expiry
    finally:
        await backend.stop()
    assert backend.redis is None


# ---- tier 2 through the stream -----------------------------------------------------------


async def test_writes_reach_mongo_and_are_acknowledged(redis: Any, ns: str) -> None:
    mongo = FakeMongo()
    backend = TieredBackend(tiered(ns), key_prefix=ns, redis=redis, mongo=mongo)
    await backend.start()
    try:
        await backend.put("r1", b'{"a":1}')
        await eventually(lambda: "r1" in mongo.docs)
        assert mongo.docs["r1"] == b'{"a":1}'
        assert await pending(redis, ns) == 0
        # a Redis miss (evicted, expired) falls back to MongoDB
        await redis.delete(f"{ns}r1")
        assert await backend.get("r1") == b'{"a":1}'
    finally:
        await backend.stop()


async def test_nothing_is_lost_while_mongo_is_down(redis: Any, ns: str) -> None:
    mongo = FakeMongo()
    mongo.down = True
    backend = TieredBackend(tiered(ns), key_prefix=ns, redis=redis, mongo=mongo)
    await backend.start()
    try:
        await backend.put("r1", b"1")
        await backend.put("r2", b"2")
        await backend.put("r3", b"3")
        assert await backend.delete("r3") is True
        await eventually(lambda: mongo.attempts >= 2)
        assert await pending(redis, ns) >= 1  # read, not acknowledged
        assert await redis.xlen(f"{ns}stream") == 4  # all kept in the stream
        assert mongo.docs == {}
        assert await backend.get("r1") == b"1"  # served by Redis meanwhile
        mongo.down = False
        await eventually(lambda: sum(len(b) for b in mongo.batches) == 4)
        assert set(mongo.docs) == {"r1", "r2"}
        assert [op.response_id for b in mongo.batches for op in b] == ["r1", "r2", "r3", "r3"]
        for _ in range(50):
            if await pending(redis, ns) == 0:
                break
            await asyncio.sleep(0.02)
        assert await pending(redis, ns) == 0
    finally:
        await backend.stop()


async def test_delete_hides_the_mongo_copy_at_once(redis: Any, ns: str) -> None:
    mongo = FakeMongo()
    mongo.docs["old"] = b"O"  # only in MongoDB (expired from Redis long ago)
    backend = TieredBackend(tiered(ns), key_prefix=ns, redis=redis, mongo=mongo)
    await backend.start()
    try:
        mongo.gate = asyncio.Event()  # hold the sync: MongoDB still has the entry
        assert await backend.get("old") == b"O"
        assert await backend.delete("old") is True
        assert await backend.get("old") is None  # the Redis tombstone hides it
        assert "old" in mongo.docs
        mongo.gate.set()
        await eventually(lambda: "old" not in mongo.docs)
        assert await backend.delete("old") is False
        assert await backend.delete("never") is False
    finally:
        await backend.stop()


def syncer(redis: Any, ns: str, writer: FakeMongo, consumer: str) -> StreamSyncer:
    cfg = StreamConfig.model_validate(
        {"key": f"{ns}stream", "consumerGroup": "sync", "blockTimeout": "20ms", "claimAge": "100ms"}
    )
    return StreamSyncer(redis, cfg, writer, consumer)


async def add(redis: Any, ns: str, *ids: str) -> None:
    for rid in ids:
        await redis.xadd(f"{ns}stream", encode_op(SyncOp("put", rid, rid.encode(), time.time())))


async def test_entries_of_a_dead_consumer_are_claimed_after_claim_age(redis: Any, ns: str) -> None:
    dead_writer, live_writer = FakeMongo(), FakeMongo()
    dead_writer.down = True
    dead = syncer(redis, ns, dead_writer, "dead")
    live = syncer(redis, ns, live_writer, "live")
    await dead.ensure_group()
    await add(redis, ns, "a", "b", "c")
    assert await dead.step() == 0  # read, write failed: pending on "dead"
    assert await pending(redis, ns) == 3
    assert await live.step() == 0  # not idle for claimAge yet: left alone
    await asyncio.sleep(0.12)
    assert await live.step() == 3  # claimed (XAUTOCLAIM), written, acknowledged
    assert [op.response_id for op in live_writer.batches[0]] == ["a", "b", "c"]
    assert await pending(redis, ns) == 0


async def test_own_pending_entries_are_retried_first(redis: Any, ns: str) -> None:
    writer = FakeMongo()
    writer.down = True
    sync = syncer(redis, ns, writer, "one")
    await sync.ensure_group()
    await add(redis, ns, "a")
    assert await sync.step() == 0
    await add(redis, ns, "b")
    writer.down = False
    # before reading "b", the consumer retries its own pending "a" (no claimAge wait)
    assert await sync.step() == 1
    assert [op.response_id for op in writer.batches[0]] == ["a"]
    assert await sync.step() == 1  # then new entries
    assert [op.response_id for b in writer.batches for op in b] == ["a", "b"]
    assert await pending(redis, ns) == 0


async def test_ack_only_after_the_write(redis: Any, ns: str) -> None:
    writer = FakeMongo()
    writer.gate = asyncio.Event()
    sync = syncer(redis, ns, writer, "one")
    await sync.ensure_group()
    await add(redis, ns, "a")
    step = asyncio.create_task(sync.step())
    await eventually(lambda: writer.attempts == 1)
    assert await pending(redis, ns) == 1  # being written: not acknowledged yet
    writer.gate.set()
    assert await step == 1
    assert await pending(redis, ns) == 0


async def test_malformed_and_trimmed_entries_do_not_block_the_stream(redis: Any, ns: str) -> None:
    writer = FakeMongo()
    writer.down = True
    sync = syncer(redis, ns, writer, "one")
    await sync.ensure_group()
    await add(redis, ns, "trimmed")
    assert await sync.step() == 0  # pending, then trimmed away by MAXLEN
    await redis.xtrim(f"{ns}stream", maxlen=0)
    await redis.xadd(f"{ns}stream", {"something": "else"})
    await add(redis, ns, "ok")
    writer.down = False
    for _ in range(4):
        await sync.step()
    assert writer.docs == {"ok": b"ok"}
    assert await pending(redis, ns) == 0


# ---- a real MongoDB, when there is one -------------------------------------------------

MONGODB_URI = os.environ.get("MONGODB_URI")
needs_mongo = pytest.mark.skipif(
    not MONGODB_URI, reason="MONGODB_URI is not set (no MongoDB server can run on this machine)"
)


@pytest.fixture
async def mongo_store() -> AsyncIterator[MongoStore]:
    assert MONGODB_URI is not None
    database = f"heimdall_test_{uuid.uuid4().hex[:12]}"
    store = MongoStore(
        MongoConfig.model_validate({"uri": MONGODB_URI, "database": database, "timeout": "5s"})
    )
    await store.start()
    yield store
    assert store._client is not None
    await store._client.drop_database(database)
    await store.close()


@needs_mongo
async def test_mongo_store_write_get_delete_and_expiry(mongo_store: MongoStore) -> None:
    now = time.time()
    await mongo_store.write(
        [
            SyncOp("put", "r1", b"one", now),
            SyncOp("put", "r2", b"two", now),
            SyncOp("put", "old", b"old", now - 31 * 24 * 3600),
            SyncOp("delete", "r2"),
        ]
    )
    assert await mongo_store.get("r1") == b"one"
    assert await mongo_store.get("r2") is None
    assert await mongo_store.get("old") is None  # past its ttl (720h)
    await mongo_store.write([SyncOp("put", "r1", b"again", now)])  # idempotent upsert
    assert await mongo_store.get("r1") == b"again"


@needs_mongo
async def test_tiered_backend_with_real_mongo(redis: Any, ns: str) -> None:
    assert MONGODB_URI is not None
    database = f"heimdall_test_{uuid.uuid4().hex[:12]}"
    cfg = tiered(ns)
    cfg = cfg.model_copy(
        update={"mongo": MongoConfig.model_validate({"uri": MONGODB_URI, "database": database})}
    )
    backend = TieredBackend(cfg, key_prefix=ns, redis=redis)
    await backend.start()
    try:
        await backend.put("r1", b"one")
        assert backend.syncer is not None
        await eventually(lambda: backend.syncer is not None and backend.syncer.synced == 1)
        await redis.delete(f"{ns}r1")
        assert await backend.get("r1") == b"one"
    finally:
        mongo = backend.mongo
        assert isinstance(mongo, MongoStore) and mongo._client is not None
        await mongo._client.drop_database(database)
        await backend.stop()


# ---- conversations: walking the links ----------------------------------------------------


def linked(prev: str | None, n: int) -> bytes:
    head = f'{{"prev":{json.dumps(prev)},' if prev is not None else "{"
    return f'{head}"owner":"","n":{n}}}'.encode()


async def test_chain_walks_the_links_in_redis_and_renews_them(redis: Any, ns: str) -> None:
    backend = TieredBackend(tiered(ns, mongo=False, ttl="1m"), key_prefix=ns, redis=redis)
    await backend.start()
    try:
        await backend.put("r0", linked(None, 0))
        for i in range(1, 10):
            await backend.put(f"r{i}", linked(f"r{i - 1}", i))
        await redis.expire(f"{ns}r0", 5)
        assert await backend.chain("r9", 100) == [
            linked(f"r{i - 1}", i) for i in range(9, 0, -1)
        ] + [linked(None, 0)]
        assert await redis.ttl(f"{ns}r0") > 5  # read by a walk: its ttl starts again
        assert await backend.chain("r9", 4) == [linked(f"r{i - 1}", i) for i in range(9, 5, -1)]
        # a gap stops the walk before it; an unknown id is no chain at all
        await backend.delete("r4")
        assert len(await backend.chain("r9", 100)) == 5
        assert await backend.chain("nope", 100) == []
    finally:
        await backend.stop()


async def test_chain_on_a_cluster_walks_entry_by_entry(redis: Any, ns: str) -> None:
    backend = TieredBackend(tiered(ns, mongo=False, ttl="1m"), key_prefix=ns, redis=redis)
    backend.target = RedisTarget("cluster", nodes=(("127.0.0.1", 6379),))
    await backend.start()
    try:
        # an id with characters JSON escapes: the link is read by decoding the entry
        odd = 'r"0\\'
        await backend.put(odd, linked(None, 0))
        await backend.put("r1", linked(odd, 1))
        await redis.expire(ns + odd, 5)
        assert await backend.chain("r1", 10) == [linked(odd, 1), linked(None, 0)]
        assert await redis.ttl(ns + odd) > 5
    finally:
        await backend.stop()


async def test_chain_reads_past_an_odd_link_in_redis(redis: Any, ns: str) -> None:
    backend = TieredBackend(tiered(ns, mongo=False), key_prefix=ns, redis=redis)
    await backend.start()
    try:
        odd = 'r"0\\'
        await backend.put(odd, linked(None, 0))
        await backend.put("r1", linked(odd, 1))
        await backend.put("r2", linked("r1", 2))
        assert await backend.chain("r2", 10) == [linked("r1", 2), linked(odd, 1), linked(None, 0)]
    finally:
        await backend.stop()


async def test_chain_falls_back_to_mongo_for_a_turn_redis_lost(redis: Any, ns: str) -> None:
    mongo = FakeMongo()
    backend = TieredBackend(tiered(ns), key_prefix=ns, redis=redis, mongo=mongo)
    await backend.start()
    try:
        for i in range(4):
            await backend.put(f"r{i}", linked(f"r{i - 1}" if i else None, i))
        await eventually(lambda: len(mongo.docs) == 4)
        await redis.delete(f"{ns}r1")  # evicted from Redis, still in MongoDB
        assert len(await backend.chain("r3", 10)) == 4
        await backend.delete("r2")  # deleted: the tombstone stops the walk
        assert await backend.chain("r3", 10) == [linked("r2", 3)]
    finally:
        await backend.stop()


@pytest.mark.slow
async def test_a_conversation_through_the_plugin_on_redis(redis: Any, ns: str) -> None:
    from tests.plugins.store.test_responses_store import chain, plugin

    backend = TieredBackend(tiered(ns, mongo=False), key_prefix=ns, redis=redis)
    store = plugin(backend=backend)
    await store.start()
    try:
        reqs = await chain(store, 300)
        assert len(reqs[-1].data["input"]) == 2 * 299 + 1
        sizes = [await redis.strlen(f"{ns}r{i}") for i in range(300)]
        assert max(sizes) < 2 * min(sizes)
        items = await store.get_input_items("r299", "")
        assert items is not None and len(items) == 599
    finally:
        await store.stop()
