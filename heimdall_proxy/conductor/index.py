"""The conductor's prefix index: which (backend, DP rank) holds which standard sequence hash
in which medium, per namespace.

Per namespace, one map per medium (conductor.tables: native while the namespace has at most
64 sources) takes a sequence hash to a bitmask of sources (a source is a backend and DP
rank; bit i is the source with index i), as the gateway's InMemoryIndex does for pods, so a
lookup is a probe and a few integer operations per block whatever the number of instances;
runs are walked by kvcache.index.walk.RunWalker. Unlike that index it keeps every medium
under its own name (gpu, cpu, disk and anything else an engine reports) and answers per
medium and per DP rank rather than one tier-weighted figure.

Engines that do not use the standard hash send token ids: their blocks are keyed by hashes
recomputed from the tokens, and a map from each publisher's engine hashes to ours is kept
(bounded) so its removals and parent hashes can be resolved (conductor.engine_map: here, or
in the ingest worker process the publisher's batches go to, which then hands the index
resolved keys through `add` and `remove`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import or_

from heimdall_proxy.conductor import native_ingest
from heimdall_proxy.conductor.engine_map import EngineMaps, Targets
from heimdall_proxy.conductor.model import Cleared, Namespace, Removed, Stored, Stream
from heimdall_proxy.conductor.tables import U64_LIMIT, BlockMap, as_dict_map, new_map
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
    """One namespace: a map per medium, and the bit of each source."""

    __slots__ = ("bits", "free", "media", "next_index", "sources")

    def __init__(self) -> None:
        self.media: dict[str, BlockMap] = {}
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
                if bit == U64_LIMIT:  # a 65th source: masks no longer fit a U64Map
                    for medium, table in self.media.items():
                        self.media[medium] = as_dict_map(table)
            self.bits[source] = bit
            self.sources[bit] = source
        return bit

    def medium(self, name: str) -> BlockMap:
        table = self.media.get(name)
        if table is None:
            table = self.media[name] = new_map(wide=self.next_index > 64)
        return table

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
        #: the engine-hash maps of the publishers whose events are resolved here (not by an
        #: ingest worker process, conductor.prepare)
        self.engines = EngineMaps(seed, self.max_keys, self.stats)

    # ---- writes ----------------------------------------------------------------------------

    def _space(self, ns: Namespace) -> _Space:
        space = self.spaces.get(ns)
        if space is None:
            space = self.spaces[ns] = _Space()
        return space

    def _set(self, d: BlockMap, bit: int, keys: Sequence[int]) -> None:
        d.or_bits(keys, bit)
        if len(d) > self.max_keys:
            self.stats.evicted_keys += d.evict_oldest(self.max_keys)

    def stored(self, publisher: str, ev: Stored) -> int:
        """Apply a `stored` event of `publisher`; returns the blocks indexed."""
        if ev.token_ids is None:
            # read only: the index keeps the ints, not the sequence
            return self.add(ev.stream, ev.seq_hashes)
        resolved = self.engines.stored(publisher, ev)
        return 0 if resolved is None else self.add(*resolved)

    def add(self, stream: Stream, keys: Sequence[int]) -> int:
        """Index standard `keys` as held by the stream's source in its medium (a stored
        event resolved already, here or by an ingest worker); returns how many."""
        space = self.spaces.get(stream.namespace) or self._space(stream.namespace)
        source = (stream.backend_id, stream.dp_rank)
        bit = space.bits.get(source) or space.bit(source)
        self._set(space.media.get(stream.medium) or space.medium(stream.medium), bit, keys)
        self.stats.stored_blocks += len(keys)
        return len(keys)

    def apply_plain(self, publisher: str, stream: Stream, payload: bytes) -> tuple[int, int, int]:
        """Apply a plain vLLM batch of `publisher` (conductor.native_ingest: `stream` is its
        registration's namespace and the batch's medium) in C, as far as it goes: (events
        applied from the first, of them stored, removed). None applied until the publisher's
        maps exist (its first stored event makes them, in Python) and while they are
        DictMaps."""
        ns = stream.namespace
        maps = self.engines.maps.get(publisher)
        emap = maps.get(ns) if maps else None
        space = self.spaces.get(ns)
        if maps is None or emap is None or space is None:
            return 0, 0, 0
        bit = space.bits.get((stream.backend_id, stream.dp_rank))
        index = space.media.get(stream.medium)
        if bit is None or index is None:
            return 0, 0, 0
        done = native_ingest.apply(
            payload, emap, index, bit, self.seed, ns.block_size, self.max_keys, len(maps) == 1
        )
        if done is None:
            return 0, 0, 0
        events, stored, blocks, removed, removed_blocks, unknown, evicted = done
        stats = self.stats
        stats.stored_blocks += blocks
        stats.removed_blocks += removed_blocks
        stats.unknown_removals += unknown
        stats.evicted_keys += evicted
        return events, stored, removed

    def removed(self, publisher: str, ev: Removed, engine_hashes: bool) -> int:
        """Apply a `removed` event; `engine_hashes`: its hashes are the engine's (resolved in
        whichever of the publisher's namespaces knows them). Returns the blocks removed."""
        stream = ev.stream
        if not engine_hashes:
            targets: Targets = [(stream.namespace, list(ev.seq_hashes))]
        else:
            targets = self.engines.removed(publisher, ev)
        return self.remove(stream, targets)

    def remove(self, stream: Stream, targets: Targets) -> int:
        """Unset the stream's source (its namespace aside) on the keys of `targets` in its
        medium; returns the blocks removed."""
        n = 0
        for ns, keys in targets:
            space = self.spaces.get(ns)
            bit = space.bits.get((stream.backend_id, stream.dp_rank)) if space else None
            d = space.media.get(stream.medium) if space else None
            if bit is not None and d is not None:
                n += d.unset_bits(keys, bit)
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
        """Unset `bit` everywhere in `media` (clears, restarts, unregistering).

        A sole source holds every key: the map is emptied outright. Otherwise one pass in C
        over the map (DictMap: a C-level scan, then updates in place) finds the keys that
        hold it: at 6.4M keys a Python pass rebuilding a dict held the event loop (and every
        query) for ~3 s."""
        n = 0
        sole = len(space.bits) == 1
        for medium in media:
            d = space.media.get(medium)
            if d is None:
                continue
            if sole:
                n += len(d)
                d.clear()
            else:
                n += d.drop_bits(bit)
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
            self.engines.drop(publisher)
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
                if not combined_walker.feed(media[0][1].get_many(chunk, 0)):
                    break
                continue
            combined: list[int] | None = None
            for (_, d), walker in zip(media, walkers, strict=True):
                masks = d.get_many(chunk, 0)
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
        return self.engines.has(publisher)

    def media_of(self, ns: Namespace) -> list[str]:
        space = self.spaces.get(ns)
        return list(space.media) if space else []
