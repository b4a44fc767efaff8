"""InMemoryIndex: the KV-block index in this process's memory."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import islice, repeat
from operator import or_

from heimdall_proxy.kvcache.index.base import StoredBlocks
from heimdall_proxy.kvcache.index.keys import (
    EngineEntry,
    engine_entries,
    evict_oldest,
    flatten_keys,
    new_keys,
    parent_of,
)
from heimdall_proxy.kvcache.index.stats import KVCacheStats
from heimdall_proxy.kvcache.index.tiers import TIERS, tier_of, tier_weights
from heimdall_proxy.kvcache.index.walk import WALK_CHUNK, RunWalker, finish_lookup, iter_bits


class InMemoryIndex:
    """Dicts of int -> int bitmask (bit i: the pod with index i), one dict per tier, so a
    lookup is one dict probe and a few integer operations per block whatever the number of
    pods, and ingest is a pop and a store per block.

    Bounds: at most `max_keys` keys per tier (the oldest written are evicted first, in chunks
    of 1/64th: LRU on write), at most `pod_cache_size` pods per key (when one more pod stores
    a key, the pod with the lowest index is dropped from it), and engine-hash maps of at most
    `max_keys` entries in all (a pod that grows its map evicts its own oldest entries)."""

    def __init__(
        self,
        block_size: int,
        max_keys: int = 100_000_000,
        pod_cache_size: int = 10,
        weights: Mapping[str, float] | None = None,
        stats: KVCacheStats | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.stats = stats or KVCacheStats()
        self.max_keys = max(1, max_keys)
        self.pod_cache_size = max(1, pod_cache_size)
        w = tier_weights(weights)
        self._weights = [w[t] for t in TIERS]
        self._tier_slot = {t: i for i, t in enumerate(TIERS)}
        self._medium_slot: dict[str | None, int] = {}
        self._tiers: list[dict[int, int]] = [{} for _ in TIERS]
        self._pod_index: dict[str, int] = {}
        self._pod_names: list[str] = []
        self._engine: list[dict[int, EngineEntry]] = []
        self._engine_total = 0
        self._spec: dict[int, int] = {}
        self._spec_expiry: dict[tuple[int, int], float] = {}
        self._spec_queue: deque[tuple[float, int, int]] = deque()

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def flush(self) -> None:
        return None

    # ---- bookkeeping ---------------------------------------------------------------------

    def _pod(self, pod: str) -> int:
        idx = self._pod_index.get(pod)
        if idx is None:
            idx = len(self._pod_names)
            self._pod_index[pod] = idx
            self._pod_names.append(pod)
            self._engine.append({})
        return idx

    def _slot(self, medium: str | None) -> int | None:
        slot = self._medium_slot.get(medium)
        if slot is None:
            slot = self._tier_slot.get(tier_of(medium))
            if slot is None:
                self.stats.unknown_medium += 1
            elif len(self._medium_slot) < 64:  # the few spellings a fleet uses
                self._medium_slot[medium] = slot
        return slot

    def _set(self, slot: int, bit: int, keys: Sequence[int]) -> None:
        d = self._tiers[slot]
        if d.keys().isdisjoint(keys):
            # All new (the common case for fresh blocks): one C-level update.
            d.update(zip(keys, repeat(bit)))
        else:
            get = d.get
            limit = self.pod_cache_size
            for key in keys:
                m = get(key, 0)
                if m & bit:
                    continue  # already held: nothing to write
                if m:
                    if m.bit_count() >= limit:
                        m &= m - 1
                    del d[key]  # written again: to the young end of the eviction order
                d[key] = m | bit
        self.stats.evicted_keys += evict_oldest(d, self.max_keys)

    def _unset(self, slot: int, bit: int, keys: Sequence[int]) -> None:
        d = self._tiers[slot]
        keep = ~bit
        for key in keys:
            m = d.get(key)
            if m is not None:
                m &= keep
                if m:
                    d[key] = m
                else:
                    del d[key]

    def _remember(self, idx: int, hashes: Sequence[int], keys: list[int], per: int) -> None:
        emap = self._engine[idx]
        before = len(emap)
        emap.update(engine_entries(hashes, keys, per))
        self._engine_total += len(emap) - before
        if self._engine_total > self.max_keys:
            n = self._engine_total - self.max_keys + max(1, self.max_keys // 64)
            n = min(len(emap), n)
            for h in list(islice(emap, n)):
                del emap[h]
            self._engine_total -= n

    # ---- events --------------------------------------------------------------------------

    def stored(self, event: StoredBlocks) -> None:
        """Synchronous block_stored (the in-memory path never waits)."""
        engine_hashes = event.engine_hashes
        slot = self._slot(event.medium)
        if slot is None or not engine_hashes:
            return
        idx = self._pod(event.pod)
        emap = self._engine[idx]
        bit = 1 << idx
        if engine_hashes[0] in emap:
            # A block stored again (after an eviction, or in another tier): its keys are
            # known, no need to hash its tokens again.
            known = list(map(emap.get, engine_hashes))
            if None not in known:
                keys = known if isinstance(known[0], int) else flatten_keys(known)  # type: ignore[arg-type]
                self._set(slot, bit, keys)  # type: ignore[arg-type]
                self.stats.stored_blocks += len(keys)
                return
        if event.location_only:
            # an offloading event: resolve what is known
            keys = flatten_keys(v for v in map(emap.get, engine_hashes) if v is not None)
            self._set(slot, bit, keys)
            self.stats.stored_blocks += len(keys)
            return
        parent_key: int | None = None
        if event.parent_hash is not None:
            parent = emap.get(event.parent_hash)
            if parent is None:
                self.stats.orphan_events += 1
                return
            parent_key = parent_of(parent)
        computed = new_keys(event, self.block_size, parent_key, self.stats)
        if computed is None:
            return
        keys, per = computed
        self._set(slot, bit, keys)
        self._remember(idx, engine_hashes, keys, per)
        self.stats.stored_blocks += len(keys)

    async def block_stored(self, event: StoredBlocks) -> None:
        self.stored(event)

    async def block_removed(
        self, pod: str, medium: str | None, engine_hashes: Sequence[int]
    ) -> None:
        slot = self._slot(medium)
        idx = self._pod_index.get(pod)
        if slot is None or idx is None:
            return
        emap = self._engine[idx]
        keys: list[int] = []
        for h in engine_hashes:
            v = emap.get(h)
            if v is None:
                self.stats.unknown_removals += 1
            elif isinstance(v, int):
                keys.append(v)
            else:
                keys.extend(v)
        self._unset(slot, 1 << idx, keys)
        self.stats.removed_blocks += len(keys)

    async def cleared(self, pod: str) -> None:
        idx = self._pod_index.get(pod)
        if idx is None:
            return
        emap = self._engine[idx]
        keys = flatten_keys(emap.values())
        for slot in range(len(TIERS)):
            self._unset(slot, 1 << idx, keys)
        self._engine_total -= len(emap)
        emap.clear()
        self.stats.cleared += 1

    # ---- speculative entries -------------------------------------------------------------

    def _sweep(self, now: float) -> None:
        queue = self._spec_queue
        while queue and queue[0][0] <= now:
            expiry, key, idx = queue.popleft()
            if self._spec_expiry.get((key, idx)) != expiry:
                continue  # added again later: that later entry expires it
            del self._spec_expiry[(key, idx)]
            m = self._spec.get(key, 0) & ~(1 << idx)
            if m:
                self._spec[key] = m
            else:
                self._spec.pop(key, None)

    async def add_speculative(self, pod: str, keys: Sequence[int], ttl: float) -> None:
        now = time.monotonic()
        self._sweep(now)
        idx = self._pod(pod)
        bit = 1 << idx
        expiry = now + ttl
        spec = self._spec
        for key in keys:
            spec[key] = spec.get(key, 0) | bit
            self._spec_expiry[(key, idx)] = expiry
            self._spec_queue.append((expiry, key, idx))
        self.stats.speculative_blocks += len(keys)

    # ---- lookups -------------------------------------------------------------------------

    def match(self, keys: Sequence[int], pods: Sequence[str]) -> dict[str, float]:
        """Synchronous lookup."""
        self.stats.lookups += 1
        candidates = 0
        names: dict[int, str] = {}
        for pod in pods:
            idx = self._pod_index.get(pod)
            if idx is not None:
                bit = 1 << idx
                candidates |= bit
                names[bit] = pod
        if not candidates or not keys:
            self.stats.lookup_keys += len(keys)
            return {}
        if self._spec_queue:
            self._sweep(time.monotonic())
        gpu = self._tiers[0].get
        spec = self._spec.get if self._spec else None
        top = self._weights[0]
        lower = sorted(
            (
                (d.get, top - w)
                for d, w in zip(self._tiers[1:], self._weights[1:], strict=True)
                if d
            ),
            key=lambda t: t[1],
        )
        walker = RunWalker(candidates, top)
        for start in range(0, len(keys), WALK_CHUNK):
            chunk = keys[start : start + WALK_CHUNK]
            zeros = repeat(0, len(chunk))
            fast = list(map(gpu, chunk, zeros))
            if spec is not None:
                fast = list(map(or_, fast, map(spec, chunk, repeat(0, len(chunk)))))
            lows = []
            for get, loss in lower:
                masks = list(map(get, chunk, repeat(0, len(chunk))))
                if any(masks):
                    lows.append((masks, loss))
            if not walker.feed(fast, lows):
                break
        return finish_lookup(self.stats, walker, len(keys), names)

    async def lookup(self, keys: Sequence[int], pods: Sequence[str]) -> dict[str, float]:
        return self.match(keys, pods)

    # ---- introspection -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._tiers[0])

    def pods_holding(self, key: int) -> dict[str, str]:
        """pod -> fastest tier holding `key` (tests, debugging)."""
        out: dict[str, str] = {}
        for tier, d in zip(TIERS, self._tiers, strict=True):
            for b in iter_bits(d.get(key, 0)):
                out.setdefault(self._pod_names[b.bit_length() - 1], tier)
        return out
