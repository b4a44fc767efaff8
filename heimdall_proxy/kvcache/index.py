"""The KV-block index: which pods hold which blocks, in which storage tier, fed by KV events.

Keys are this gateway's own block keys (heimdall_proxy.kvcache.hashing), recomputed from the
token ids a BlockStored event carries: vLLM's own hashes depend on its hash function and seed,
so they are only used to find our key again when a block is removed (each pod has a map from
its engine hashes to our keys). An event whose parent block is unknown (events were missed)
cannot be placed in the chain and is dropped (counted as an orphan).

Lookups answer, per pod, the length of the run of blocks it holds from the start of the
prompt, each block weighted by the fastest tier holding it (GPU 1.0, CPU 0.8, disk 0.5 by
default): the longest-prefix score of the precise prefix-cache scorer.

Backends: InMemoryIndex (bounded by a key count, or by bytes for costAwareMemoryConfig) here,
RedisIndex in redis_index.py. Both implement the KVBlockIndex Protocol.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate, groupby, islice, repeat
from operator import and_, or_
from typing import Protocol

from heimdall_proxy.kvcache.hashing import chain_keys, local_hashes

#: Storage tiers in a fixed slot order (the Redis layout depends on it); vLLM's `medium`
#: is matched case-insensitively, a missing medium is the GPU.
TIERS = ("gpu", "cpu", "disk")
DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8, "disk": 0.5}


@dataclass(slots=True)
class KVCacheStats:
    """Counters of the index and its event feed (enableMetrics logs them)."""

    batches: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    orphan_events: int = 0
    unknown_removals: int = 0
    block_size_mismatch: int = 0
    unknown_medium: int = 0
    unknown_events: int = 0
    decode_errors: int = 0
    gaps: int = 0
    missed_batches: int = 0
    replayed_batches: int = 0
    publisher_restarts: int = 0
    evicted_keys: int = 0
    speculative_blocks: int = 0
    lookups: int = 0
    lookup_hits: int = 0
    #: Blocks of the prompts looked up, and those some candidate held (the longest run).
    lookup_keys: int = 0
    lookup_key_hits: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def tier_of(medium: str | None) -> str:
    return "gpu" if not medium else medium.lower()


def tier_weights(overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    weights = dict(DEFAULT_TIER_WEIGHTS)
    for name, weight in (overrides or {}).items():
        key = name.lower()
        if key not in TIERS:
            raise ValueError(f"unknown storage tier {name!r} (known: {', '.join(TIERS)})")
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"tier weight of {name!r} must be in [0, 1], got {weight}")
        weights[key] = float(weight)
    return weights


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1}
for _i, _u in enumerate("KMGT", start=1):
    _UNITS[_u] = _UNITS[_u + "B"] = 1000**_i
    _UNITS[_u + "I"] = _UNITS[_u + "IB"] = 1024**_i


def parse_bytes(value: str | int) -> int:
    """ "2GiB", "500MiB", "1GB", "4096" -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError("a size must be positive")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise ValueError(f"invalid size {value!r} (want e.g. '2GiB', '500MiB')")
    unit = (match.group(2) or "").upper()
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError("a size must be positive")
    return size


def event_keys(
    token_ids: Sequence[int],
    engine_block_size: int,
    n_hashes: int,
    block_size: int,
    seed: int,
    parent_key: int | None,
    local: Sequence[int] | None = None,
) -> tuple[list[int], int] | None:
    """Our keys for a BlockStored event and how many of them each engine block spans, or None
    when the engine's block size is not a multiple of ours (the blocks cannot be mapped).
    `local`: the local hashes of the event's tokens in our blocks, when already computed
    (kvcache.prepare does it off the event loop); the token ids are not read then."""
    if engine_block_size <= 0 or engine_block_size % block_size:
        return None
    per = engine_block_size // block_size
    if local is None:
        n = min(n_hashes, len(token_ids) // engine_block_size)
        if len(token_ids) != n * engine_block_size:
            token_ids = token_ids[: n * engine_block_size]
        local = local_hashes(token_ids, block_size, seed)
    else:
        n = min(n_hashes, len(local) // per)
        if len(local) != n * per:
            local = local[: n * per]
    return chain_keys(local, seed, parent_key), per


#: What a pod's engine-hash map holds per engine block: our key, or our keys when an engine
#: block spans several of ours.
EngineEntry = int | tuple[int, ...]


def engine_entries(
    hashes: Sequence[int], keys: Sequence[int], per: int
) -> Iterable[tuple[int, EngineEntry]]:
    """(engine hash, entry) for each engine block whose `per` keys are in `keys`."""
    if per == 1:
        return zip(hashes, keys, strict=False)
    return (
        (h, tuple(keys[j * per : (j + 1) * per])) for j, h in enumerate(hashes[: len(keys) // per])
    )


def flatten_keys(entries: Iterable[EngineEntry]) -> list[int]:
    """The keys of engine-map entries, in order."""
    out: list[int] = []
    for v in entries:
        if isinstance(v, int):
            out.append(v)
        else:
            out.extend(v)
    return out


class KVBlockIndex(Protocol):
    """An index backend. All methods are coroutines so a remote backend fits; `flush` makes
    the writes queued so far visible (a no-op in memory)."""

    block_size: int
    stats: KVCacheStats

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def block_stored(
        self,
        pod: str,
        medium: str | None,
        engine_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        engine_block_size: int,
        seed: int,
        *,
        local_hashes: Sequence[int] | None = None,
    ) -> None:
        """Apply one BlockStored event of `pod`; `local_hashes` (in our block size, with
        `seed`) stand in for the token ids when kvcache.prepare computed them already."""
        ...

    async def block_removed(
        self, pod: str, medium: str | None, engine_hashes: Sequence[int]
    ) -> None: ...

    async def cleared(self, pod: str) -> None:
        """Forget everything `pod` holds (AllBlocksCleared, a restarted or departed pod)."""
        ...

    async def add_speculative(self, pod: str, keys: Sequence[int], ttl: float) -> None:
        """Assume `pod` holds `keys` (in its GPU tier) for `ttl` seconds."""
        ...

    async def lookup(self, keys: Sequence[int], pods: Sequence[str]) -> dict[str, float]:
        """Per pod, the tier-weighted length of its run of `keys` from the first; pods with
        none are left out."""
        ...

    async def flush(self) -> None: ...


def iter_bits(mask: int) -> list[int]:
    """The single-bit values set in `mask`."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low)
        mask ^= low
    return out


class RunWalker:
    """Longest runs of blocks from the start of a prompt, per pod, fed the prompt's presence
    masks a chunk at a time (bit b: the pod with bit b holds the block).

    `fast[j]` has the pods holding block j in the fastest tier (or speculatively); each entry
    of `lows` is (masks, loss) for a slower tier, fastest first, where `loss` is the weight a
    block held only there loses. The walk over a chunk is C-level (itertools.accumulate of
    the AND of masks); Python code runs only where a pod drops out or a block is held in a
    slower tier only."""

    __slots__ = ("alive", "blocks", "deficit", "done", "dropped_at", "runs", "top")

    def __init__(self, candidates: int, top_weight: float = 1.0) -> None:
        self.alive = candidates
        self.top = top_weight
        self.blocks = 0
        self.deficit: dict[int, float] = {}
        self.runs: dict[int, float] = {}
        self.dropped_at = 0
        self.done = not candidates

    def feed(self, fast: list[int], lows: Sequence[tuple[list[int], float]] = ()) -> bool:
        """Walk one chunk; False once no candidate is left (the rest of the prompt is moot)."""
        if self.done:
            return False
        present = fast
        for masks, _ in lows:
            present = list(map(or_, present, masks))
        acc = list(accumulate(present, and_, initial=self.alive))
        if lows:
            covered = fast
            deficit = self.deficit
            for masks, loss in lows:
                for j, m in enumerate(masks):
                    m &= acc[j + 1] & ~covered[j]
                    if m:
                        for b in iter_bits(m):
                            deficit[b] = deficit.get(b, 0.0) + loss
                covered = list(map(or_, covered, masks))
        final = acc[-1]
        if final != self.alive:
            # acc only ever loses bits: visit the points where it changes (groupby runs in C)
            prev = self.alive
            base = self.blocks - 1
            for a, group in groupby(range(1, len(acc)), acc.__getitem__):
                if a == prev:
                    continue
                held = self.dropped_at = base + next(group)
                if held:
                    for b in iter_bits(prev & ~a):
                        self.runs[b] = held * self.top - self.deficit.get(b, 0.0)
                prev = a
                if not a:
                    break
            self.alive = final
        self.blocks += len(fast)
        if not final:
            self.done = True
        return not self.done

    @property
    def longest(self) -> int:
        """Blocks from the start held by some candidate (the longest run, unweighted)."""
        return self.blocks if self.alive else self.dropped_at

    def result(self, names: Mapping[int, str]) -> dict[str, float]:
        """pod name -> weighted run, for pods that hold at least the first block."""
        runs = dict(self.runs)
        if self.alive and self.blocks:
            for b in iter_bits(self.alive):
                runs[b] = self.blocks * self.top - self.deficit.get(b, 0.0)
        return {names[b]: v for b, v in runs.items() if v > 0.0}


def finish_lookup(
    stats: KVCacheStats, walker: RunWalker, n_keys: int, names: Mapping[int, str]
) -> dict[str, float]:
    """A finished walk's result, counted in `stats` (the lookup itself already was)."""
    out = walker.result(names)
    stats.lookup_keys += n_keys
    stats.lookup_key_hits += walker.longest
    if out:
        stats.lookup_hits += 1
    return out


#: Blocks looked up per step of a walk (a cold prompt stops after the first step).
WALK_CHUNK = 64


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

    def _evict(self, d: dict[int, int]) -> None:
        n = len(d) - self.max_keys + max(1, self.max_keys // 64)
        for key in list(islice(d, n)):
            del d[key]
        self.stats.evicted_keys += n

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
        if len(d) > self.max_keys:
            self._evict(d)

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

    def stored(
        self,
        pod: str,
        medium: str | None,
        engine_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        engine_block_size: int,
        seed: int,
        local_hashes: Sequence[int] | None = None,
    ) -> None:
        """Synchronous block_stored (the in-memory path never waits)."""
        slot = self._slot(medium)
        if slot is None or not engine_hashes:
            return
        idx = self._pod(pod)
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
        if not token_ids and local_hashes is None:
            # a location-only event (offloading): resolve what is known
            found = [v for v in map(emap.get, engine_hashes) if v is not None]
            keys = flatten_keys(found)
            self._set(slot, bit, keys)
            self.stats.stored_blocks += len(keys)
            return
        parent_key: int | None = None
        if parent_hash is not None:
            parent = emap.get(parent_hash)
            if parent is None:
                self.stats.orphan_events += 1
                return
            parent_key = parent if isinstance(parent, int) else parent[-1]
        computed = event_keys(
            token_ids,
            engine_block_size,
            len(engine_hashes),
            self.block_size,
            seed,
            parent_key,
            local_hashes,
        )
        if computed is None:
            self.stats.block_size_mismatch += 1
            return
        keys, per = computed
        self._set(slot, bit, keys)
        self._remember(idx, engine_hashes, keys, per)
        self.stats.stored_blocks += len(keys)

    async def block_stored(
        self,
        pod: str,
        medium: str | None,
        engine_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        engine_block_size: int,
        seed: int,
        *,
        local_hashes: Sequence[int] | None = None,
    ) -> None:
        self.stored(
            pod,
            medium,
            engine_hashes,
            parent_hash,
            token_ids,
            engine_block_size,
            seed,
            local_hashes,
        )

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


#: Footprint of one stored block in InMemoryIndex (its key in a tier dict, its bitmask, its
#: engine-map entry), measured with tracemalloc: 95-135 bytes while the index grows, up to
#: ~230 once it churns at its bound (CPython dict tables are sized at 3x their live entries
#: on resize). tests/kvcache/test_index.py checks a churning index stays within its budget.
BYTES_PER_BLOCK = 256


class CostAwareMemoryIndex(InMemoryIndex):
    """InMemoryIndex bounded by memory: the byte budget is turned into a block budget with
    the measured per-block footprint (BYTES_PER_BLOCK); no per-key pod limit."""

    def __init__(
        self,
        block_size: int,
        size: str | int = "2GiB",
        weights: Mapping[str, float] | None = None,
        stats: KVCacheStats | None = None,
    ) -> None:
        self.max_bytes = parse_bytes(size)
        super().__init__(
            block_size,
            max_keys=max(64, self.max_bytes // BYTES_PER_BLOCK),
            pod_cache_size=1 << 30,
            weights=weights,
            stats=stats,
        )
