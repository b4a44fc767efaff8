"""The tiered responses-store backend: Redis/Valkey as tier 1, optionally MongoDB as tier 2.

Writes go to Redis (`SET` with the Redis ttl) and, when MongoDB is configured, are also
appended to a Redis stream in the same round trip. A consumer in every gateway replica
reads that stream as one consumer group and writes the entries to MongoDB, acknowledging a
stream entry only after MongoDB took it: while MongoDB is down entries stay pending in the
stream and are retried, by this consumer first and, once idle for `claimAge`, by any other
(XAUTOCLAIM), so a replica that dies mid-batch loses nothing. Reads try Redis, then MongoDB.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from heimdall_proxy.plugins.store.backends import entry_link
from heimdall_proxy.plugins.store.params import MongoConfig, RedisConfig, StreamConfig, TieredConfig

log = logging.getLogger(__name__)

#: Prefix of the Redis keys holding entries (`heimdall:responses:<response id>`).
KEY_PREFIX = "heimdall:responses:"
#: What a deleted entry's key holds until its ttl ends, when MongoDB is configured, so a read
#: does not fall back to a MongoDB copy the sync has not deleted yet. Entries are JSON
#: objects and never empty.
TOMBSTONE = b""

#: Walks a conversation's links inside Redis in one round trip (see TieredBackend.chain):
#: ARGV = key prefix, first id, most entries, ttl seconds (0: none). Returns the entries
#: found, newest first; it stops at a missing key, a tombstone, an entry without a link, or
#: a link it cannot read without decoding JSON (an escaped character), and the client goes on
#: from there. The keys are not declared in KEYS, as they are only known while walking: used
#: on a standalone Redis / Sentinel master only, never on a Cluster.
CHAIN_SCRIPT = """
local prefix, rid = ARGV[1], ARGV[2]
local limit, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local found = {}
while rid and #found < limit do
  local key = prefix .. rid
  local entry = redis.call('GET', key)
  if not entry or entry == '' then break end
  if ttl > 0 then redis.call('EXPIRE', key, ttl) end
  found[#found + 1] = entry
  rid = string.match(entry, '^{"prev":"([^"\\\\]*)"')
end
return found
"""

#: redis-py's asyncio clients (Redis, RedisCluster, a Sentinel master). Its type hints
#: describe the sync and async clients at once (`X | Awaitable[X]`), so it is used untyped.
RedisClient = Any


# ---- connecting -----------------------------------------------------------------------


def _host_port(entry: str) -> tuple[str, int]:
    text = entry.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        return text.strip("[]"), 6379
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise ValueError(f"redis: bad host:port {entry!r}") from None


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """How to reach Redis, decided from the parameters (validated when the config loads,
    connected when the plugin starts)."""

    mode: Literal["standalone", "sentinel", "cluster"]
    url: str = ""
    nodes: tuple[tuple[str, int], ...] = ()
    master_name: str = ""


def redis_target(cfg: RedisConfig) -> RedisTarget:
    """Standalone from `address` (valkey:// is redis:// to redis-py; a bare host:port is
    taken as redis://), Sentinel from `addresses` + `masterName`, standalone from a single
    bare address, Cluster from several. Raises ValueError."""
    if cfg.address:
        url = cfg.address if "://" in cfg.address else f"redis://{cfg.address}"
        scheme, _, rest = url.partition("://")
        scheme = {"valkey": "redis", "valkeys": "rediss"}.get(scheme.lower(), scheme.lower())
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"redis: address must be a redis:// or valkey:// URL, got {url!r}")
        return RedisTarget("standalone", url=f"{scheme}://{rest}")
    nodes = tuple(_host_port(a) for a in cfg.addresses or [])
    if cfg.master_name:
        return RedisTarget("sentinel", nodes=nodes, master_name=cfg.master_name)
    if len(nodes) == 1:
        host, port = nodes[0]
        return RedisTarget("standalone", url=f"redis://{host}:{port}")
    if cfg.db:
        raise ValueError("redis: a Cluster (several addresses, no masterName) has only db 0")
    return RedisTarget("cluster", nodes=nodes)


#: Client timeouts. The reference has no parameter for them, and redis-py's defaults (5 s to
#: connect, ten retries) would hold a request for most of a minute when Redis is
#: unreachable: the store is on the request path, so it fails fast instead.
CONNECT_TIMEOUT = 1.0
COMMAND_TIMEOUT = 2.0


def connect_redis(cfg: RedisConfig, target: RedisTarget, block_timeout: float = 1.0) -> RedisClient:
    """A redis-py asyncio client; no connection is opened until the first command. The
    `username`, `password` and `db` parameters win over the same parts of the URL.
    `block_timeout` is the longest a command blocks server-side (the stream consumer's
    XREADGROUP): the socket timeout is that plus COMMAND_TIMEOUT."""
    from redis.asyncio import ConnectionPool, Redis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.connection import parse_url
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import ConstantBackoff

    options: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_timeout": block_timeout + COMMAND_TIMEOUT,
        "retry": Retry(ConstantBackoff(0.05), 1),
    }
    if cfg.username:
        options["username"] = cfg.username
    if cfg.password.get_secret_value():
        options["password"] = cfg.password.get_secret_value()
    if target.mode == "cluster":
        nodes = [ClusterNode(h, p) for h, p in target.nodes]
        return RedisCluster(startup_nodes=nodes, **options)
    if target.mode == "sentinel":
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes), socket_connect_timeout=CONNECT_TIMEOUT
        )
        return sentinel.master_for(target.master_name, db=cfg.db, **options)
    options = {**parse_url(target.url), **options}
    if cfg.db or "db" in cfg.model_fields_set:
        options["db"] = cfg.db
    return Redis.from_pool(ConnectionPool(**options))


# ---- the MongoDB tier -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncOp:
    """One stream entry: store `entry` under `response_id`, or delete it."""

    op: Literal["put", "delete"]
    response_id: str
    entry: bytes = b""
    #: time.time() when the gateway stored it (the MongoDB ttl counts from there)
    stored_at: float = 0.0


class MongoTier(Protocol):
    """The second tier as the backend uses it: the MongoDB implementation below, or a fake
    in tests."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def write(self, ops: Sequence[SyncOp]) -> None:
        """Apply the ops in order. Each is idempotent, so a batch that failed half-way is
        simply applied again. Raises when MongoDB did not take them."""
        ...

    async def get(self, response_id: str) -> bytes | None: ...


class MongoStore:
    """Entries in one collection: `{_id: response id, entry: <JSON bytes>, expires_at}`,
    with a TTL index on `expires_at` (MongoDB removes expired documents about once a minute;
    reads check `expires_at` themselves). Every operation is bounded by `timeout`."""

    def __init__(self, cfg: MongoConfig) -> None:
        self.cfg = cfg
        self._client: Any = None
        self._collection: Any = None
        self._indexed = False

    async def start(self) -> None:
        from pymongo import AsyncMongoClient

        self._client = AsyncMongoClient(
            self.cfg.uri,
            timeoutMS=int(self.cfg.timeout * 1000),
            serverSelectionTimeoutMS=max(1, int(self.cfg.timeout * 1000)),
        )
        self._collection = self._client[self.cfg.database][self.cfg.collection]

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _ensure_index(self) -> None:
        # Lazily, so a gateway starts while MongoDB is down; retried until it succeeds.
        if not self._indexed:
            await self._collection.create_index("expires_at", expireAfterSeconds=0)
            self._indexed = True

    def _expires_at(self, stored_at: float) -> dt.datetime | None:
        if self.cfg.ttl <= 0:
            return None
        return dt.datetime.fromtimestamp(stored_at + self.cfg.ttl, dt.UTC)

    async def write(self, ops: Sequence[SyncOp]) -> None:
        from bson import Binary
        from pymongo import DeleteOne, UpdateOne

        await self._ensure_index()
        requests: list[Any] = []
        for op in ops:
            if op.op == "delete":
                requests.append(DeleteOne({"_id": op.response_id}))
            else:
                doc = {"entry": Binary(op.entry), "expires_at": self._expires_at(op.stored_at)}
                requests.append(UpdateOne({"_id": op.response_id}, {"$set": doc}, upsert=True))
        if requests:
            await self._collection.bulk_write(requests, ordered=True)

    async def get(self, response_id: str) -> bytes | None:
        doc = await self._collection.find_one({"_id": response_id})
        if doc is None:
            return None
        expires_at = doc.get("expires_at")
        if isinstance(expires_at, dt.datetime):
            if expires_at.tzinfo is None:
                expires_at = expires_at.replace(tzinfo=dt.UTC)
            if expires_at <= dt.datetime.now(dt.UTC):
                return None
        entry = doc.get("entry")
        return bytes(entry) if isinstance(entry, bytes | bytearray) else None


# ---- the stream consumer --------------------------------------------------------------


def _decode(fields: dict[bytes, bytes] | None) -> SyncOp | None:
    if not fields:
        return None
    op = fields.get(b"op")
    rid = fields.get(b"id")
    if op not in (b"put", b"delete") or not rid:
        return None
    try:
        stored_at = float(fields.get(b"ts", b"0"))
    except ValueError:
        stored_at = 0.0
    return SyncOp(
        "put" if op == b"put" else "delete",
        rid.decode("utf-8", "replace"),
        fields.get(b"entry", b""),
        stored_at or time.time(),
    )


def encode_op(op: SyncOp) -> dict[str, bytes | str]:
    return {"op": op.op, "id": op.response_id, "entry": op.entry, "ts": repr(op.stored_at)}


class StreamSyncer:
    """The consumer that copies stream entries to the MongoDB tier (see the module doc).

    Each step: first retry this consumer's own unacknowledged entries (after a failed write,
    in stream order, so a later delete is never overtaken by an earlier put); then claim
    entries any consumer left pending for longer than `claimAge` (XAUTOCLAIM); then read new
    ones (XREADGROUP `>`, blocking up to `blockTimeout`). A batch is acknowledged (XACK) only
    once the writer applied it. An entry that cannot be decoded is acknowledged and dropped
    with a warning, so it cannot block the stream."""

    def __init__(
        self,
        redis: RedisClient,
        cfg: StreamConfig,
        writer: MongoTier,
        consumer: str | None = None,
    ) -> None:
        self.redis = redis
        self.cfg = cfg
        self.writer = writer
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._claim_cursor: bytes | str = "0-0"
        self._backlog = True  # entries of a previous run of this consumer name, if any
        self._group_ready = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: entries written to MongoDB and acknowledged since start (for tests and logs)
        self.synced = 0

    async def ensure_group(self) -> None:
        from redis.exceptions import ResponseError

        try:
            await self.redis.xgroup_create(
                self.cfg.key, self.cfg.consumer_group, id="0", mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def step(self) -> int:
        """One round; returns how many entries were synced and acknowledged. Raises when
        Redis fails; a MongoDB failure is logged and leaves the entries pending."""
        if not self._group_ready:
            await self.ensure_group()
        cfg = self.cfg
        if self._backlog:
            reply = await self.redis.xreadgroup(
                cfg.consumer_group, self.consumer, {cfg.key: "0"}, count=cfg.batch_size
            )
            entries = reply[0][1] if reply else []
            if entries:
                return await self._apply(entries)
            self._backlog = False
        claimed = await self.redis.xautoclaim(
            cfg.key,
            cfg.consumer_group,
            self.consumer,
            min_idle_time=int(cfg.claim_age * 1000),
            start_id=self._claim_cursor,
            count=cfg.batch_size,
        )
        self._claim_cursor = claimed[0]
        if claimed[1]:
            return await self._apply(claimed[1])
        reply = await self.redis.xreadgroup(
            cfg.consumer_group,
            self.consumer,
            {cfg.key: ">"},
            count=cfg.batch_size,
            block=max(1, int(cfg.block_timeout * 1000)),
        )
        entries = reply[0][1] if reply else []
        return await self._apply(entries) if entries else 0

    async def _apply(self, entries: list[tuple[bytes, dict[bytes, bytes] | None]]) -> int:
        ids = [entry_id for entry_id, _ in entries]
        ops: list[SyncOp] = []
        for entry_id, fields in entries:
            op = _decode(fields)
            if op is None:
                # trimmed by MAXLEN while pending (no fields), or not ours
                if fields:
                    log.warning("dropping malformed responses-store sync entry %r", entry_id)
                continue
            ops.append(op)
        try:
            await self.writer.write(ops)
        except Exception as exc:
            self._backlog = True
            log.warning(
                "responses-store: MongoDB write failed, %d entries stay pending: %r",
                len(ops),
                exc,
            )
            return 0
        await self.redis.xack(self.cfg.key, self.cfg.consumer_group, *ids)
        self.synced += len(ops)
        return len(ops)

    async def run(self) -> None:
        """step() until stopped, backing off `blockTimeout` after a failure."""
        while not self._stopping:
            try:
                if await self.step() == 0 and self._backlog:
                    await asyncio.sleep(self.cfg.block_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("responses-store: stream sync failed: %r", exc)
                await asyncio.sleep(self.cfg.block_timeout)

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self.run(), name="responses-store-sync")

    async def stop(self) -> None:
        if self._task is not None:
            # The flag as well as the cancel: on Python 3.11 asyncio.wait_for (which
            # redis-py uses to send a command) can swallow a cancellation that lands as the
            # send completes; the loop then ends after its current step instead.
            self._stopping = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


# ---- the backend ----------------------------------------------------------------------


class TieredBackend:
    """StoreBackend over Redis (+ MongoDB). `redis` and `mongo` may be injected (tests);
    otherwise they are made from the parameters when the plugin starts."""

    def __init__(
        self,
        cfg: TieredConfig,
        *,
        key_prefix: str = KEY_PREFIX,
        redis: RedisClient | None = None,
        mongo: MongoTier | None = None,
        consumer: str | None = None,
    ) -> None:
        assert cfg.redis is not None  # TieredConfig validates it
        self.cfg = cfg
        self.redis_cfg = cfg.redis
        self.target = redis_target(cfg.redis)
        self.max_entry_bytes = cfg.redis.max_entry_bytes
        self.key_prefix = key_prefix
        self.redis = redis
        self._owns_redis = redis is None
        self.mongo = mongo if mongo is not None else (MongoStore(cfg.mongo) if cfg.mongo else None)
        self._consumer = consumer
        self.syncer: StreamSyncer | None = None
        self._chain_script: Any = None

    def _key(self, response_id: str) -> str:
        return self.key_prefix + response_id

    def _client(self) -> RedisClient:
        if self.redis is None:
            raise RuntimeError("the responses store is not started")
        return self.redis

    async def start(self) -> None:
        if self.redis is None:
            self.redis = connect_redis(self.redis_cfg, self.target, self.cfg.stream.block_timeout)
        if self.mongo is not None:
            await self.mongo.start()
            self.syncer = StreamSyncer(self.redis, self.cfg.stream, self.mongo, self._consumer)
            try:
                await self.syncer.ensure_group()
            except Exception as exc:  # Redis down at start-up: the sync loop keeps trying
                log.warning("responses-store: cannot create the stream consumer group: %r", exc)
            self.syncer.start()

    async def stop(self) -> None:
        if self.syncer is not None:
            await self.syncer.stop()
            self.syncer = None
        if self.mongo is not None:
            await self.mongo.close()
        if self.redis is not None and self._owns_redis:
            await self.redis.aclose()
            self.redis = None

    def _ttl(self) -> int | None:
        ttl = self.redis_cfg.ttl
        return max(1, round(ttl)) if ttl > 0 else None

    async def _write(self, response_id: str, value: bytes, op: SyncOp | None) -> None:
        pipe = self._client().pipeline(transaction=False)
        pipe.set(self._key(response_id), value, ex=self._ttl())
        if op is not None and self.mongo is not None:
            stream = self.cfg.stream
            pipe.xadd(stream.key, encode_op(op), maxlen=stream.max_len, approximate=True)
        await pipe.execute()

    async def put(self, response_id: str, entry: bytes) -> None:
        await self._write(response_id, entry, SyncOp("put", response_id, entry, time.time()))

    async def get(self, response_id: str) -> bytes | None:
        value: bytes | None = await self._client().get(self._key(response_id))
        if value is not None:
            return None if value == TOMBSTONE else value
        if self.mongo is None:
            return None
        return await self.mongo.get(response_id)

    async def chain(self, response_id: str, limit: int) -> list[bytes]:
        """In Redis by CHAIN_SCRIPT (one round trip per `limit` entries) on a standalone
        Redis or a Sentinel master; entry by entry on a Cluster, whose keys live on several
        nodes. An entry missing in Redis is looked up in MongoDB, and the walk goes on."""
        found: list[bytes] = []
        rid: str | None = response_id
        ttl = self._ttl() or 0
        while rid is not None and len(found) < limit:
            if self.target.mode != "cluster":
                if self._chain_script is None:
                    self._chain_script = self._client().register_script(CHAIN_SCRIPT)
                args = [self.key_prefix, rid, limit - len(found), ttl]
                walked: list[bytes] = await self._chain_script(keys=[], args=args)
                if walked:
                    found.extend(walked)
                    rid = entry_link(walked[-1])
                    continue
            # a Cluster, a Redis miss (MongoDB may have it) or a link the script cannot read
            entry = await self.get(rid)
            if entry is None:
                break
            if ttl and self.target.mode == "cluster":
                await self._client().expire(self._key(rid), ttl)
            found.append(entry)
            rid = entry_link(entry)
        return found

    async def delete(self, response_id: str) -> bool:
        if self.mongo is None:
            return bool(await self._client().delete(self._key(response_id)))
        if await self.get(response_id) is None:
            return False
        await self._write(response_id, TOMBSTONE, SyncOp("delete", response_id))
        return True
