"""RedisIndex: the KV-block index in Redis or Valkey, shared by several gateway replicas.

Layout (every key under `prefix`, default "heimdall:kv:"; standalone Redis / Valkey, the
scripts name keys they compute, which Redis Cluster would not accept):

- `pods`        HASH pod name -> pod index, allocated once by a script, so every replica
                gives a pod the same index;
- `b:<key>`     STRING bitmap of one block key: bit `index * 3 + slot` is set when the pod
                holds the block in tier slot (0 GPU, 1 CPU, 2 disk);
- `s:<key>`     STRING bitmap of speculative entries (bit `index * 3`), expiring with PEXPIRE;
- `e:<pod>`     HASH engine hash -> our key(s), to apply BlockRemoved and AllBlocksCleared;
                an entry goes when no tier holds the block any more.

`<key>`, engine hashes and key lists are 8-byte big-endian binary (keys and hash fields are
binary-safe in Redis), so a whole event travels as two arguments.

Writes are Lua scripts queued on a pipeline and sent once per event batch (`flush`). A lookup
is one script: it MGETs the prompt's bitmaps, stops at the first block nobody holds, and
returns them concatenated at a fixed width, so the reply is one string whatever the prompt
length; the run lengths are computed here with integer masks.

Replicas that subscribe to the same pods write the same bits (idempotent), so they converge
on one index; each keeps a local cache of engine-hash -> key maps to avoid a round trip for
the parent of every stored event.
"""

from __future__ import annotations

import functools
import logging
import struct
import time
from collections.abc import Mapping, Sequence
from functools import reduce
from importlib import resources
from itertools import islice, repeat
from operator import itemgetter, lshift, or_
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from heimdall_proxy.kvcache.index.base import StoredBlocks
from heimdall_proxy.kvcache.index.keys import (
    EngineEntry,
    engine_entries,
    flatten_keys,
    new_keys,
    parent_of,
)
from heimdall_proxy.kvcache.index.stats import KVCacheStats
from heimdall_proxy.kvcache.index.tiers import TIERS, tier_of, tier_weights
from heimdall_proxy.kvcache.index.walk import RunWalker, finish_lookup

_first = itemgetter(0)
_BIG: Literal["big"] = "big"

log = logging.getLogger(__name__)

_T = len(TIERS)

#: The Lua scripts, one file each under lua/ (shipped as package data).
SCRIPTS: dict[str, str] = {
    name: (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    for name in ("alloc", "store", "store_known", "remove", "clear", "speculate", "lookup")
}


#: Client timeouts (seconds): connecting, and any one command (a lookup is on the request path).
CONNECT_TIMEOUT = 1.0
COMMAND_TIMEOUT = 0.5

#: Engine-hash -> key entries cached per pod (the rest is read back from Redis when needed).
LOCAL_CACHE_PER_POD = 200_000
_CLEAR_CHUNK = 2000
_U64 = (1 << 64) - 1


def blob(values: Sequence[int]) -> bytes:
    """Values as concatenated 8-byte big-endian (engine hashes taken modulo 2**64)."""
    try:
        return struct.pack(f">{len(values)}Q", *values)
    except struct.error:  # a negative or wider engine hash
        return struct.pack(f">{len(values)}Q", *(v & _U64 for v in values))


def unblob(data: bytes) -> list[int]:
    return list(struct.unpack(f">{len(data) // 8}Q", data[: len(data) // 8 * 8]))


@functools.lru_cache(maxsize=64)
def _splitter(width: int) -> Any:
    return struct.Struct(f"{width}s").iter_unpack


#: Blocks per store script call: Lua's unpack() takes at most a few thousand values.
_STORE_CHUNK = 1024


def names_blob(prefix: bytes, keys: Sequence[int]) -> bytes:
    """`prefix + 8-byte big-endian key` for every key, concatenated. Built column by column
    with strided slice assignments (one C-level copy per byte of the name), so the names of
    a long prompt cost a few dozen C calls, not a Python step per key."""
    n = len(keys)
    width = len(prefix) + 8
    out = bytearray(n * width)
    for j, byte in enumerate(prefix):
        out[j::width] = bytes((byte,)) * n
    packed = blob(keys)
    for j in range(8):
        out[len(prefix) + j :: width] = packed[j::8]
    return bytes(out)


def normalize_address(address: str) -> str:
    """redis:// URL for a Redis or Valkey address (valkey:// and bare host:port accepted)."""
    if address.startswith("valkey://"):
        return "redis://" + address[len("valkey://") :]
    if address.startswith("valkeys://"):
        return "rediss://" + address[len("valkeys://") :]
    if "://" not in address:
        return "redis://" + address
    return address


class RedisIndex:
    """KVBlockIndex in Redis / Valkey (see the module docstring for the layout)."""

    def __init__(
        self,
        block_size: int,
        address: str = "redis://127.0.0.1:6379",
        key_prefix: str = "heimdall:kv:",
        weights: Mapping[str, float] | None = None,
        stats: KVCacheStats | None = None,
        backend_type: str = "redis",
        speculative: bool = False,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.stats = stats or KVCacheStats()
        self.address = normalize_address(address)
        self.backend_type = backend_type
        self.prefix = key_prefix
        self._block_prefix = (key_prefix + "b:").encode()
        self._spec_prefix = (key_prefix + "s:").encode()
        self._name_width = len(self._block_prefix) + 8
        self.speculative = speculative
        w = tier_weights(weights)
        self._weights = [w[t] for t in TIERS]
        self._slot = {t: i for i, t in enumerate(TIERS)}
        self._redis: aioredis.Redis | None = None
        self._queued: list[tuple[str, list[Any]]] = []
        self._pod_index: dict[str, int] = {}
        self._unknown_pods: dict[str, float] = {}
        self._cache: dict[str, dict[int, EngineEntry]] = {}
        self._scripts: dict[str, AsyncScript] = {}

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def redis(self) -> aioredis.Redis:
        if self._redis is None:
            raise RuntimeError("the Redis index is not started")
        return self._redis

    async def start(self) -> None:
        if self._redis is not None:
            return
        client: aioredis.Redis = aioredis.from_url(
            self.address,
            decode_responses=False,
            # explicit, whatever redis-py's defaults (none in 5.x-7.x, 5 s in 8.x): a lookup
            # is on the request path
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=COMMAND_TIMEOUT,
        )
        try:
            await client.ping()
        except Exception as exc:
            await client.aclose()
            raise ConnectionError(
                f"cannot reach the {self.backend_type} index at {self.address}: {exc}"
            ) from exc
        self._redis = client
        for name, body in SCRIPTS.items():
            self._scripts[name] = client.register_script(body)
        await self._load_scripts()

    async def _load_scripts(self) -> None:
        for script in self._scripts.values():
            script.sha = await self.redis.script_load(script.script)

    async def close(self) -> None:
        if self._redis is not None:
            try:
                await self.flush()
            finally:
                await self._redis.aclose()
                self._redis = None

    async def flush(self) -> None:
        """Send the writes queued since the last flush in one pipeline (one round trip)."""
        queued, self._queued = self._queued, []
        for attempt in range(2):
            if not queued or self._redis is None:
                return
            pipe = self._redis.pipeline(transaction=False)
            for script, args in queued:
                pipe.evalsha(self._scripts[script].sha, 0, *args)
            results = await pipe.execute(raise_on_error=False)
            retry: list[tuple[str, list[Any]]] = []
            for item, result in zip(queued, results, strict=True):
                if isinstance(result, NoScriptError) and attempt == 0:
                    retry.append(item)  # the server lost its scripts (restart, FLUSH)
                elif isinstance(result, Exception):
                    log.warning("KV index write failed: %s", result)
                elif isinstance(result, list) and len(result) == 2:  # remove: removed, unknown
                    self.stats.removed_blocks += int(result[0])
                    self.stats.unknown_removals += int(result[1])
            if retry:
                await self._load_scripts()
            queued = retry

    def _queue(self, script: str, args: list[Any]) -> None:
        self._queued.append((script, args))

    @property
    def pending(self) -> int:
        """Writes queued and not yet flushed."""
        return len(self._queued)

    # ---- pods ----------------------------------------------------------------------------

    async def _pod(self, pod: str) -> int:
        idx = self._pod_index.get(pod)
        if idx is None:
            idx = int(await self._scripts["alloc"](keys=[self.prefix + "pods"], args=[pod]))
            self._pod_index[pod] = idx
        return idx

    async def _known_indices(self, pods: Sequence[str]) -> dict[str, int]:
        """Indices of `pods`, read from Redis for pods this replica has not seen (another
        replica may have indexed them)."""
        now = time.monotonic()
        missing = [
            p for p in pods if p not in self._pod_index and self._unknown_pods.get(p, 0.0) <= now
        ]
        if missing:
            values = await self.redis.hmget(self.prefix + "pods", missing)
            for pod, value in zip(missing, values, strict=True):
                if value is None:
                    self._unknown_pods[pod] = now + 1.0
                else:
                    self._pod_index[pod] = int(value)
                    self._unknown_pods.pop(pod, None)
        return {p: self._pod_index[p] for p in pods if p in self._pod_index}

    def _local(self, pod: str) -> dict[int, EngineEntry]:
        cache = self._cache.get(pod)
        if cache is None:
            cache = self._cache[pod] = {}
        return cache

    def _slot_of(self, medium: str | None) -> int | None:
        slot = self._slot.get(tier_of(medium))
        if slot is None:
            self.stats.unknown_medium += 1
        return slot

    async def _parent_key(self, pod: str, parent_hash: int) -> int | None:
        cached = self._local(pod).get(parent_hash)
        if cached is None:
            raw = await self.redis.hget(self.prefix + "e:" + pod, blob([parent_hash]))
            if not raw:
                return None
            keys = unblob(raw.encode() if isinstance(raw, str) else raw)
            cached = keys[0] if len(keys) == 1 else tuple(keys)
            self._local(pod)[parent_hash] = cached
        return parent_of(cached)

    # ---- events --------------------------------------------------------------------------

    async def block_stored(self, event: StoredBlocks) -> None:
        engine_hashes = event.engine_hashes
        slot = self._slot_of(event.medium)
        if slot is None or not engine_hashes:
            return
        pod = event.pod
        idx = await self._pod(pod)
        offset = idx * _T + slot
        cache = self._local(pod)
        known = list(map(cache.get, engine_hashes))
        if None not in known:  # stored again: keys known, no hashing
            first = known[0]
            per = 1 if isinstance(first, int) else len(first)  # type: ignore[arg-type]
            self._store(pod, offset, per, engine_hashes, flatten_keys(known))  # type: ignore[arg-type]
            return
        if event.location_only:
            self._queue("store_known", [self.prefix, pod, offset, blob(engine_hashes)])
            return
        parent_key: int | None = None
        if event.parent_hash is not None:
            parent_key = await self._parent_key(pod, event.parent_hash)
            if parent_key is None:
                self.stats.orphan_events += 1
                return
        computed = new_keys(event, self.block_size, parent_key, self.stats)
        if computed is None:
            return
        keys, per = computed
        stored = engine_hashes[: len(keys) // per]
        cache.update(engine_entries(stored, keys, per))
        self._store(pod, offset, per, stored, keys)
        if len(cache) > LOCAL_CACHE_PER_POD:
            for h in list(islice(cache, LOCAL_CACHE_PER_POD // 64)):
                del cache[h]

    def _store(
        self, pod: str, offset: int, per: int, hashes: Sequence[int], keys: Sequence[int]
    ) -> None:
        step = max(1, _STORE_CHUNK // per)
        for i in range(0, len(hashes), step):
            own = keys[i * per : (i + step) * per]
            mine = blob(own)
            self._queue(
                "store",
                [
                    self.prefix,
                    pod,
                    offset,
                    self._name_width,
                    per,
                    blob(hashes[i : i + step]),
                    mine,
                    names_blob(self._block_prefix, own),
                ],
            )
        self.stats.stored_blocks += len(keys)

    async def block_removed(
        self, pod: str, medium: str | None, engine_hashes: Sequence[int]
    ) -> None:
        slot = self._slot_of(medium)
        if slot is None or not engine_hashes:
            return
        idx = await self._pod(pod)
        self._queue("remove", [self.prefix, pod, idx, slot, _T, blob(engine_hashes)])

    async def cleared(self, pod: str) -> None:
        await self.flush()
        idx = await self._pod(pod)
        emap = self.prefix + "e:" + pod
        values = await self.redis.hvals(emap)
        keys = b"".join(v.encode() if isinstance(v, str) else v for v in values)
        step = _CLEAR_CHUNK * 8
        for start in range(0, len(keys), step):
            chunk = keys[start : start + step]
            await self._scripts["clear"](keys=[], args=[self.prefix, idx, _T, chunk])
        await self.redis.delete(emap)
        self._cache.pop(pod, None)
        self.stats.cleared += 1

    async def add_speculative(self, pod: str, keys: Sequence[int], ttl: float) -> None:
        if not keys:
            return
        self.speculative = True
        idx = await self._pod(pod)
        ttl_ms = max(1, int(ttl * 1000))
        names = names_blob(self._spec_prefix, keys)
        await self._scripts["speculate"](keys=[], args=[idx * _T, ttl_ms, self._name_width, names])
        self.stats.speculative_blocks += len(keys)

    # ---- lookups -------------------------------------------------------------------------

    async def lookup(self, keys: Sequence[int], pods: Sequence[str]) -> dict[str, float]:
        self.stats.lookups += 1
        if not keys:
            return {}
        indices = await self._known_indices(pods)
        if not indices:
            self.stats.lookup_keys += len(keys)
            return {}
        width = (_T * (max(indices.values()) + 1) + 7) // 8
        names = names_blob(self._block_prefix, keys)
        snames = names_blob(self._spec_prefix, keys) if self.speculative else b""
        main, spec = await self._scripts["lookup"](
            keys=[], args=[self._name_width, width, names, snames]
        )
        return self._walk(main, spec, width, indices, len(keys))

    def _walk(
        self, main: bytes, spec: bytes, width: int, indices: dict[str, int], n_keys: int
    ) -> dict[str, float]:
        n = len(main) // width
        if not n:
            self.stats.lookup_keys += n_keys
            return {}
        top_bit = 8 * width - 1
        names: dict[int, str] = {}
        gpu = 0
        for pod, idx in indices.items():
            bit = 1 << (top_bit - idx * _T)  # the pod's GPU slot; CPU one bit lower, disk two
            gpu |= bit
            names[bit] = pod
        split = _splitter(width)
        values = list(map(int.from_bytes, map(_first, split(main)), repeat(_BIG, n)))
        # The walk ANDs every mask into the candidates' GPU-slot bits, so the other bits of a
        # bitmap (CPU, disk, other pods) need no masking out.
        fast = values
        if len(spec) == len(main):
            specs = map(int.from_bytes, map(_first, split(spec)), repeat(_BIG, n))
            fast = list(map(or_, values, specs))
        top = self._weights[0]
        lows = []
        anywhere = reduce(or_, values, 0)
        for shift in range(1, _T):
            if (anywhere << shift) & gpu:  # some candidate holds some block in this tier
                masks = list(map(lshift, values, repeat(shift, n)))
                lows.append((masks, top - self._weights[shift]))
        lows.sort(key=lambda t: t[1])
        walker = RunWalker(gpu, top)
        walker.feed(fast, lows)
        return finish_lookup(self.stats, walker, n_keys, names)
