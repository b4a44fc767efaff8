"""RedisIndex: the KV-block index in Redis or Valkey, shared by several gateway replicas.

Layout (every key under `prefix`, default "heimdall:kv:"; standalone Redis / Valkey, the
scripts name keys they compute, which Redis Cluster would not accept):

- `pods`        HASH pod name -> pod index, allocated once by a script, so every replica
                gives a pod the same index;
- `b:<key>`     STRING bitmap of one block key: bit `index * 3 + slot` is set when the pod
                holds the block in tier slot (0 GPU, 1 CPU, 2 disk);
- `s:<key>`     STRING bitmap of speculative entries (bit `index * 3`), expiring with PEXPIRE;
- `e:<pod>`     HASH engine hash -> our key(s) (comma-separated), to apply BlockRemoved and
                AllBlocksCleared; an entry goes when no tier holds the block any more.

Writes are Lua scripts queued on a pipeline and sent once per event batch (`flush`). A lookup
is one script: it MGETs the prompt's bitmaps, stops at the first block nobody holds, and
returns them concatenated at a fixed width, so the reply is one string whatever the prompt
length; the run lengths are computed here with integer masks.

Replicas that subscribe to the same pods write the same bits (idempotent), so they converge
on one index; each keeps a local cache of engine-hash -> key maps to avoid a round trip for
the parent of every stored event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from heimdall_proxy.kvcache.index import (
    TIERS,
    KVCacheStats,
    event_keys,
    iter_bits,
    tier_of,
    tier_weights,
)

log = logging.getLogger("heimdall_proxy.kvcache.redis")

_T = len(TIERS)

_ALLOC = """
local i = redis.call('HGET', KEYS[1], ARGV[1])
if i then return tonumber(i) end
i = redis.call('HLEN', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[1], i)
return i
"""

# ARGV: prefix, pod, bit offset, then pairs (engine hash, keys csv)
_STORE = """
local p = ARGV[1]
local emap = p .. 'e:' .. ARGV[2]
local off = tonumber(ARGV[3])
for i = 4, #ARGV, 2 do
  redis.call('HSET', emap, ARGV[i], ARGV[i + 1])
  for k in string.gmatch(ARGV[i + 1], '[^,]+') do
    redis.call('SETBIT', p .. 'b:' .. k, off, 1)
  end
end
return 0
"""

# ARGV: prefix, pod, bit offset, engine hashes... (location-only events)
_STORE_KNOWN = """
local p = ARGV[1]
local emap = p .. 'e:' .. ARGV[2]
local off = tonumber(ARGV[3])
local n = 0
for i = 4, #ARGV do
  local keys = redis.call('HGET', emap, ARGV[i])
  if keys then
    for k in string.gmatch(keys, '[^,]+') do
      redis.call('SETBIT', p .. 'b:' .. k, off, 1)
      n = n + 1
    end
  end
end
return n
"""

# ARGV: prefix, pod, pod index, slot, tiers, engine hashes...
_REMOVE = """
local p = ARGV[1]
local emap = p .. 'e:' .. ARGV[2]
local base = tonumber(ARGV[3]) * tonumber(ARGV[5])
local slot = tonumber(ARGV[4])
local tiers = tonumber(ARGV[5])
local removed, unknown = 0, 0
for i = 6, #ARGV do
  local keys = redis.call('HGET', emap, ARGV[i])
  if not keys then
    unknown = unknown + 1
  else
    local held = false
    for k in string.gmatch(keys, '[^,]+') do
      local bk = p .. 'b:' .. k
      redis.call('SETBIT', bk, base + slot, 0)
      removed = removed + 1
      for t = 0, tiers - 1 do
        if t ~= slot and redis.call('GETBIT', bk, base + t) == 1 then held = true end
      end
      if redis.call('BITCOUNT', bk) == 0 then redis.call('DEL', bk) end
    end
    if not held then redis.call('HDEL', emap, ARGV[i]) end
  end
end
return {removed, unknown}
"""

# ARGV: prefix, pod index, tiers, keys...
_CLEAR = """
local p = ARGV[1]
local base = tonumber(ARGV[2]) * tonumber(ARGV[3])
local tiers = tonumber(ARGV[3])
for i = 4, #ARGV do
  local bk = p .. 'b:' .. ARGV[i]
  for t = 0, tiers - 1 do redis.call('SETBIT', bk, base + t, 0) end
  if redis.call('BITCOUNT', bk) == 0 then redis.call('DEL', bk) end
end
return 0
"""

# ARGV: prefix, bit offset, ttl ms, keys...
_SPECULATE = """
local p = ARGV[1]
local off = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
for i = 4, #ARGV do
  local sk = p .. 's:' .. ARGV[i]
  redis.call('SETBIT', sk, off, 1)
  redis.call('PEXPIRE', sk, ttl)
end
return 0
"""

# ARGV: prefix, width, with speculative (0/1), keys... -> {bitmaps, speculative bitmaps}
_LOOKUP = """
local p = ARGV[1]
local w = tonumber(ARGV[2])
local spec = ARGV[3] == '1'
local n = #ARGV - 3
local names = {}
for i = 1, n do names[i] = p .. 'b:' .. ARGV[i + 3] end
local vals = redis.call('MGET', unpack(names))
local specs = nil
if spec then
  for i = 1, n do names[i] = p .. 's:' .. ARGV[i + 3] end
  specs = redis.call('MGET', unpack(names))
end
local zero = string.rep('\\0', w)
local out, sout = {}, {}
local function fit(v)
  if not v then return zero end
  local len = #v
  if len < w then return v .. string.sub(zero, 1, w - len) end
  if len > w then return string.sub(v, 1, w) end
  return v
end
for i = 1, n do
  local v = vals[i]
  local s = specs and specs[i]
  if not v and not s then break end
  out[i] = fit(v)
  if specs then sout[i] = fit(s) end
end
return {table.concat(out), table.concat(sout)}
"""

#: Engine-hash -> key entries cached per pod (the rest is read back from Redis when needed).
LOCAL_CACHE_PER_POD = 200_000
_CLEAR_CHUNK = 2000


def _csv(raw: str | bytes) -> list[int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return [int(k) for k in text.split(",") if k]


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
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.stats = stats or KVCacheStats()
        self.address = normalize_address(address)
        self.backend_type = backend_type
        self.prefix = key_prefix
        w = tier_weights(weights)
        self._weights = [w[t] for t in TIERS]
        self._slot = {t: i for i, t in enumerate(TIERS)}
        self._redis: aioredis.Redis | None = None
        self._queued: list[tuple[str, list[Any]]] = []
        self._pod_index: dict[str, int] = {}
        self._unknown_pods: dict[str, float] = {}
        self._cache: dict[str, dict[int, int | tuple[int, ...]]] = {}
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
        client: aioredis.Redis = aioredis.from_url(self.address, decode_responses=False)
        try:
            await client.ping()
        except Exception as exc:
            await client.aclose()
            raise ConnectionError(
                f"cannot reach the {self.backend_type} index at {self.address}: {exc}"
            ) from exc
        self._redis = client
        for name, body in (
            ("alloc", _ALLOC),
            ("store", _STORE),
            ("store_known", _STORE_KNOWN),
            ("remove", _REMOVE),
            ("clear", _CLEAR),
            ("speculate", _SPECULATE),
            ("lookup", _LOOKUP),
        ):
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

    def _local(self, pod: str) -> dict[int, int | tuple[int, ...]]:
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
            raw = await self.redis.hget(self.prefix + "e:" + pod, str(parent_hash))
            if raw is None:
                return None
            keys = tuple(_csv(raw))
            cached = keys[0] if len(keys) == 1 else keys
            self._local(pod)[parent_hash] = cached
        return cached if isinstance(cached, int) else cached[-1]

    # ---- events --------------------------------------------------------------------------

    async def block_stored(
        self,
        pod: str,
        medium: str | None,
        engine_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        engine_block_size: int,
        seed: int,
    ) -> None:
        slot = self._slot_of(medium)
        if slot is None or not engine_hashes:
            return
        idx = await self._pod(pod)
        offset = idx * _T + slot
        cache = self._local(pod)
        known = list(map(cache.get, engine_hashes))
        if None not in known:  # stored again: keys known, no hashing
            pairs: list[Any] = []
            for h, v in zip(engine_hashes, known, strict=True):
                pairs += [h, str(v) if isinstance(v, int) else ",".join(map(str, v))]  # type: ignore[arg-type]
            self._queue("store", [self.prefix, pod, offset, *pairs])
            self.stats.stored_blocks += len(pairs) // 2
            return
        if not token_ids:
            self._queue("store_known", [self.prefix, pod, offset, *engine_hashes])
            return
        parent_key: int | None = None
        if parent_hash is not None:
            parent_key = await self._parent_key(pod, parent_hash)
            if parent_key is None:
                self.stats.orphan_events += 1
                return
        computed = event_keys(
            token_ids, engine_block_size, len(engine_hashes), self.block_size, seed, parent_key
        )
        if computed is None:
            self.stats.block_size_mismatch += 1
            return
        keys, per = computed
        args: list[Any] = [self.prefix, pod, offset]
        for j, h in enumerate(engine_hashes[: len(keys) // per]):
            mine = keys[j * per : (j + 1) * per]
            cache[h] = mine[0] if per == 1 else tuple(mine)
            args += [h, ",".join(map(str, mine))]
        self._queue("store", args)
        self.stats.stored_blocks += len(keys)
        if len(cache) > LOCAL_CACHE_PER_POD:
            for h in list(islice(cache, LOCAL_CACHE_PER_POD // 64)):
                del cache[h]

    async def block_removed(
        self, pod: str, medium: str | None, engine_hashes: Sequence[int]
    ) -> None:
        slot = self._slot_of(medium)
        if slot is None or not engine_hashes:
            return
        idx = await self._pod(pod)
        self._queue("remove", [self.prefix, pod, idx, slot, _T, *engine_hashes])

    async def cleared(self, pod: str) -> None:
        await self.flush()
        idx = await self._pod(pod)
        emap = self.prefix + "e:" + pod
        values = await self.redis.hvals(emap)
        keys = [k for raw in values for k in _csv(raw)]
        for start in range(0, len(keys), _CLEAR_CHUNK):
            chunk = keys[start : start + _CLEAR_CHUNK]
            await self._scripts["clear"](keys=[], args=[self.prefix, idx, _T, *chunk])
        await self.redis.delete(emap)
        self._cache.pop(pod, None)
        self.stats.cleared += 1

    async def add_speculative(self, pod: str, keys: Sequence[int], ttl: float) -> None:
        if not keys:
            return
        idx = await self._pod(pod)
        ttl_ms = max(1, int(ttl * 1000))
        await self._scripts["speculate"](keys=[], args=[self.prefix, idx * _T, ttl_ms, *keys])
        self.stats.speculative_blocks += len(keys)

    # ---- lookups -------------------------------------------------------------------------

    async def lookup(self, keys: Sequence[int], pods: Sequence[str]) -> dict[str, float]:
        self.stats.lookups += 1
        if not keys:
            return {}
        indices = await self._known_indices(pods)
        if not indices:
            return {}
        width = (_T * (max(indices.values()) + 1) + 7) // 8
        main, spec = await self._scripts["lookup"](keys=[], args=[self.prefix, width, 1, *keys])
        return self._walk(main, spec, width, indices)

    def _walk(
        self, main: bytes, spec: bytes, width: int, indices: dict[str, int]
    ) -> dict[str, float]:
        top = 8 * width - 1
        names: dict[int, str] = {}
        candidates = 0
        for pod, idx in indices.items():
            bit = 1 << (top - idx * _T)  # the pod's GPU slot; CPU is one bit lower, disk two
            candidates |= bit
            names[bit] = pod
        weights = self._weights
        top_weight = weights[0]
        lower = [(shift, top_weight - weights[shift]) for shift in range(1, _T)]
        n = len(main) // width
        has_spec = len(spec) == len(main)
        deficit: dict[int, float] = {}
        out: dict[str, float] = {}
        alive = candidates
        run = 0
        from_bytes = int.from_bytes
        for i in range(n):
            v = from_bytes(main[i * width : (i + 1) * width], "big")
            present = v & alive
            if has_spec:
                present |= from_bytes(spec[i * width : (i + 1) * width], "big") & alive
            if v:
                for shift, loss in lower:
                    m = (v << shift) & alive & ~present
                    if m:
                        present |= m
                        for b in iter_bits(m):
                            deficit[b] = deficit.get(b, 0.0) + loss
            dead = alive & ~present
            if dead:
                alive &= present
                if i:
                    for b in iter_bits(dead):
                        out[names[b]] = i * top_weight - deficit.get(b, 0.0)
                if not alive:
                    break
            run = i + 1
        if alive and run:
            for b in iter_bits(alive):
                out[names[b]] = run * top_weight - deficit.get(b, 0.0)
        if out:
            self.stats.lookup_hits += 1
        return out
