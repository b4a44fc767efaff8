"""The conductor's prefix index: which (backend, DP rank) holds which standard sequence hash
in which medium, per namespace.

Per namespace, one dict per medium maps a sequence hash to a bitmask of sources (a source is
a backend and DP rank; bit i is the source with index i), as the gateway's InMemoryIndex does
for pods, so a lookup is a dict probe and a few integer operations per block whatever the
number of instances; runs are walked by kvcache.index.walk.RunWalker. Unlike that index it
keeps every medium under its own name (gpu, cpu, disk and anything else an engine reports)
and answers per medium and per DP rank rather than one tier-weighted figure.

Engines that do not use the standard hash send token ids: their blocks are keyed by hashes
recomputed from the tokens (kvcache.index.keys.event_keys), and a map from each publisher's
engine hashes to ours is kept (bounded) so its removals and parent hashes can be resolved."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import or_

from heimdall_proxy.conductor.model import Cleared, Namespace, Removed, Stored, Stream
from heimdall_proxy.kvcache.index.keys import (
    EngineEntry,
    engine_entries,
    event_keys,
    evict_oldest,
    flatten_keys,
    parent_of,
)
from heimdall_proxy.kvcache.index.stats import KVCacheStats
from heimdall_proxy.kvcache.index.walk import WALK_CHUNK, RunWalker

#: The media every answer names, even at 0 (tiers G1, G2, G3).
STANDARD_MEDIA = ("gpu", "cpu", "disk")
Source = tuple[str, int]  # (backend_id, dp_rank)


@dataclass(slots=True)
class InstanceHit:
    """What one instance holds of a prompt, in blocks from its start."""

    longest: int = 0
    media: dict[str, int] = field(default_factory=dict)
    dp: dict[int, int] = field(default_factory=dict)


class _Space:
    """One namespace: a dict per medium, and the bit of each source."""

    __slots__ = ("bits", "free", "media", "next_index", "sources")

    def __init__(self) -> None:
        self.media: dict[str, dict[int, int]] = {}
        self.bits: dict[Source, int] = {}
        self.sources: dict[int, Source] = {}
        self.free: list[int] = []
        self.next_index = 0

    def bit(self, source: Source) -> int:
        bit = self.bits.get(source)
        if bit is None:
            if self.free:
                bit = self.free.pop()
            else:
                bit = 1 << self.next_index
                self.next_index += 1
            self.bits[source] = bit
            self.sources[bit] = source
        return bit

    def release(self, source: Source) -> None:
        bit = self.bits.pop(source, None)
        if bit is not None:
            del self.sources[bit]
            self.free.append(bit)


class ConductorIndex:
    """The index; all methods are synchronous (it lives in the service's memory).

    Bounds: at most `max_keys` hashes per namespace and medium (the oldest written are evicted
    first, 1/64th at a time) and `max_keys` engine-hash entries per publisher."""

    def __init__(
        self, seed: int, max_keys: int = 50_000_000, stats: KVCacheStats | None = None
    ) -> None:
        self.seed = seed
        self.max_keys = max(64, max_keys)
        self.stats = stats or KVCacheStats()
        self.spaces: dict[Namespace, _Space] = {}
        #: publisher -> namespace -> engine hash -> our key(s)
        self._engine: dict[str, dict[Namespace, dict[int, EngineEntry]]] = {}

    # ---- writes ----------------------------------------------------------------------------

    def _space(self, ns: Namespace) -> _Space:
        space = self.spaces.get(ns)
        if space is None:
            space = self.spaces[ns] = _Space()
        return space

    def _set(self, d: dict[int, int], bit: int, keys: Sequence[int]) -> None:
        if d.keys().isdisjoint(keys):
            d.update(zip(keys, repeat(bit)))  # all new: one C-level update
        else:
            get = d.get
            for key in keys:
                m = get(key, 0)
                if not m & bit:
                    d[key] = m | bit
        self.stats.evicted_keys += evict_oldest(d, self.max_keys)

    @staticmethod
    def _unset(d: dict[int, int], bit: int, keys: Iterable[int]) -> int:
        keep = ~bit
        n = 0
        for key in keys:
            m = d.get(key)
            if m is not None and m & bit:
                n += 1
                m &= keep
                if m:
                    d[key] = m
                else:
                    del d[key]
        return n

    def _chained_stream(self, publisher: str, ev: Stored) -> Stream:
        """Where a token-id event of `publisher` belongs: a request's cache_salt reaches only
        a prompt's first block, so a block chained on a parent (or an offloading event, which
        names known blocks) goes to the namespace that holds that parent (or those blocks),
        if it is another salt of the event's own. Else the event's own stream."""
        stream = ev.stream
        ns = stream.namespace
        if ev.parent_hash is not None:
            probe = ev.parent_hash
        elif ev.seq_hashes and not ev.has_tokens:
            probe = ev.seq_hashes[0]
        else:
            return stream
        maps = self._engine.get(publisher, {})
        own = maps.get(ns)
        if own is not None and probe in own:
            return stream
        for other, emap in maps.items():
            if (
                other != ns
                and probe in emap
                and (other.model, other.block_size, other.lora, other.tenant)
                == (ns.model, ns.block_size, ns.lora, ns.tenant)
            ):
                return Stream(other, stream.backend_id, stream.medium, stream.dp_rank)
        return stream

    def stored(self, publisher: str, ev: Stored) -> int:
        """Apply a `stored` event of `publisher`; returns the blocks indexed."""
        stream = ev.stream if ev.token_ids is None else self._chained_stream(publisher, ev)
        ns = stream.namespace
        space = self._space(ns)
        bit = space.bit((stream.backend_id, stream.dp_rank))
        d = space.media.setdefault(stream.medium, {})
        hashes = ev.seq_hashes
        keys: Sequence[int]
        if ev.token_ids is None:
            keys = hashes  # read only: the index keeps the ints, not the sequence
        else:
            emap = self._engine.setdefault(publisher, {}).setdefault(ns, {})
            known = [emap.get(h) for h in hashes] if hashes and hashes[0] in emap else None
            if known is not None and None not in known:
                keys = flatten_keys(known)  # type: ignore[arg-type]  # stored again elsewhere
            elif not ev.has_tokens:  # an offloading event: move what is known
                keys = flatten_keys(v for v in map(emap.get, hashes) if v is not None)
            else:
                parent_key: int | None = None
                if ev.parent_hash is not None:
                    parent = emap.get(ev.parent_hash)
                    if parent is None:
                        self.stats.orphan_events += 1
                        return 0
                    parent_key = parent_of(parent)
                computed = self._event_keys(ev, ns.block_size, parent_key)
                if computed is None:
                    self.stats.block_size_mismatch += 1
                    return 0
                keys, per = computed
                emap.update(engine_entries(hashes, keys, per))
                evict_oldest(emap, self.max_keys)
        self._set(d, bit, keys)
        self.stats.stored_blocks += len(keys)
        return len(keys)

    def _event_keys(
        self, ev: Stored, block_size: int, parent_key: int | None
    ) -> tuple[list[int], int] | None:
        """The standard keys of a token-carrying event chained on `parent_key`, and how many
        each engine block spans: a worker's keys when it chained them on that same parent
        (conductor.prepare), else chained here (from its local hashes when it sent them)."""
        engine_block_size = ev.engine_block_size or block_size
        if ev.keys is not None and ev.keys_parent == parent_key and engine_block_size > 0:
            per, rest = divmod(engine_block_size, block_size)
            n = min(len(ev.seq_hashes), len(ev.keys) // per) * per if not rest else 0
            if n:
                keys = ev.keys if len(ev.keys) == n else ev.keys[:n]
                return (keys if type(keys) is list else list(keys)), per
        return event_keys(
            ev.token_ids or (),
            engine_block_size,
            len(ev.seq_hashes),
            block_size,
            self.seed,
            parent_key,
            ev.local_hashes,
        )

    def removed(self, publisher: str, ev: Removed, engine_hashes: bool) -> int:
        """Apply a `removed` event; `engine_hashes`: its hashes are the engine's (resolved in
        whichever of the publisher's namespaces knows them). Returns the blocks removed."""
        stream = ev.stream
        if not engine_hashes:
            targets = [(stream.namespace, list(ev.seq_hashes))]
        else:
            targets = []
            resolved = 0
            for ns, emap in self._engine.get(publisher, {}).items():
                found = [v for v in map(emap.get, ev.seq_hashes) if v is not None]
                if found:
                    resolved += len(found)
                    targets.append((ns, flatten_keys(found)))
            self.stats.unknown_removals += max(0, len(ev.seq_hashes) - resolved)
        n = 0
        for ns, keys in targets:
            space = self.spaces.get(ns)
            bit = space.bits.get((stream.backend_id, stream.dp_rank)) if space else None
            d = space.media.get(stream.medium) if space else None
            if bit is not None and d is not None:
                n += self._unset(d, bit, keys)
        self.stats.removed_blocks += n
        return n

    def cleared(self, publisher: str, ev: Cleared) -> int:
        """Apply a `cleared` event (see model.Cleared for its scope); returns the blocks
        dropped."""
        stream = ev.stream
        source = (stream.backend_id, stream.dp_rank)
        self.stats.cleared += 1
        if ev.all_namespaces and ev.all_media:
            return self.drop_source(stream.namespace.tenant, source, publisher)
        spaces = (
            [s for ns, s in self.spaces.items() if ns.tenant == stream.namespace.tenant]
            if ev.all_namespaces
            else [self.spaces[stream.namespace]]
            if stream.namespace in self.spaces
            else []
        )
        n = 0
        for space in spaces:
            bit = space.bits.get(source)
            if bit is not None:
                media = list(space.media) if ev.all_media else [stream.medium]
                n += self._drop_bit(space, bit, media)
        return n

    def _drop_bit(self, space: _Space, bit: int, media: Iterable[str]) -> int:
        keep = ~bit
        n = 0
        for medium in media:
            d = space.media.get(medium)
            if d is None:
                continue
            held = sum(1 for m in d.values() if m & bit)
            if held:  # rare (clears, restarts, unregistering): rebuilt in one pass
                space.media[medium] = {k: m & keep for k, m in d.items() if m & keep}
                n += held
        return n

    def drop_source(self, tenant: str, source: Source, publisher: str | None = None) -> int:
        """Forget every block of `source` in the tenant's namespaces (a publisher restarted,
        cleared everything, or was unregistered); returns the blocks dropped."""
        n = 0
        for ns, space in list(self.spaces.items()):
            if ns.tenant != tenant:
                continue
            bit = space.bits.get(source)
            if bit is None:
                continue
            n += self._drop_bit(space, bit, list(space.media))
            space.release(source)
            if not space.bits:
                del self.spaces[ns]
        if publisher is not None:
            self._engine.pop(publisher, None)
        return n

    # ---- reads ------------------------------------------------------------------------------

    def query(
        self, ns: Namespace, keys: Sequence[int], backends: Iterable[str]
    ) -> dict[str, InstanceHit]:
        """Per backend in `backends` that holds the first block of `keys` in some medium: the
        longest run from the start (over all media, best DP rank), per medium and per DP
        rank, in blocks."""
        space = self.spaces.get(ns)
        if space is None or not keys:
            return {}
        wanted = set(backends)
        candidates = 0
        for (backend, _), bit in space.bits.items():
            if backend in wanted:
                candidates |= bit
        if not candidates:
            return {}
        media = list(space.media.items())
        if not media:
            return {}
        walkers = [RunWalker(candidates) for _ in media]
        # one medium (the usual case): its run is the run over all media
        combined_walker = walkers[0] if len(media) == 1 else RunWalker(candidates)
        for start in range(0, len(keys), WALK_CHUNK):
            chunk = keys[start : start + WALK_CHUNK]
            if combined_walker is walkers[0]:
                if not combined_walker.feed(list(map(media[0][1].get, chunk, repeat(0)))):
                    break
                continue
            combined: list[int] | None = None
            for (_, d), walker in zip(media, walkers, strict=True):
                masks = list(map(d.get, chunk, repeat(0, len(chunk))))
                if not walker.done:
                    walker.feed(masks)
                combined = masks if combined is None else list(map(or_, combined, masks))
            if combined is None or not combined_walker.feed(combined):
                break
        sources = space.sources  # bit -> (backend, rank): the walkers' results name them
        combined_runs = combined_walker.result(sources)
        # one medium: its runs are the combined ones, filled in the same pass
        only = media[0][0] if len(media) == 1 else None
        out: dict[str, InstanceHit] = {}
        for (backend, rank), run in combined_runs.items():
            blocks = int(run)
            hit = out.get(backend)
            if hit is None:
                hit = out[backend] = InstanceHit()
            hit.dp[rank] = blocks
            if blocks > hit.longest:
                hit.longest = blocks
            if only is not None and blocks > hit.media.get(only, 0):
                hit.media[only] = blocks
        if only is None:
            for (medium, _), walker in zip(media, walkers, strict=True):
                for (backend, _), run in walker.result(sources).items():
                    held = out[backend].media
                    blocks = int(run)
                    if blocks > held.get(medium, 0):
                        held[medium] = blocks
        return out

    # ---- introspection ----------------------------------------------------------------------

    def blocks_per_medium(self) -> dict[str, int]:
        """Hashes held per medium, over all namespaces (a hash held by several sources
        counts once per namespace)."""
        out: dict[str, int] = {}
        for space in self.spaces.values():
            for medium, d in space.media.items():
                out[medium] = out.get(medium, 0) + len(d)
        return out

    def sources_of(self, ns: Namespace) -> set[Source]:
        """The (backend, DP rank) pairs that hold or held blocks of `ns`."""
        space = self.spaces.get(ns)
        return set(space.bits) if space else set()

    def has_engine_map(self, publisher: str) -> bool:
        """Whether `publisher` sent token ids with its own hashes (its removals name them)."""
        return publisher in self._engine

    def media_of(self, ns: Namespace) -> list[str]:
        space = self.spaces.get(ns)
        return list(space.media) if space else []
