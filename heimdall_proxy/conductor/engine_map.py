"""Engine hashes -> standard keys, per publisher: how a token-id event becomes index keys.

Engines that do not use the standard hash (vLLM, SGLang, a standardized publisher sending
token ids) name their blocks by their own hashes. Their stored events carry token ids, from
which the standard keys are recomputed (chained on the parent's key), and each publisher
keeps a map from its engine hashes to our keys so that a later event's parent, and its
removals, can be resolved.

The map is its own object, not part of the index, so that it can live where the events are
decoded: on the event loop with the index (ConductorIndex owns one), or in the ingest worker
process that a publisher's batches always go to (conductor.prepare), which then ships the
index only resolved keys. Either way the same code decides, so the answers are the same."""

from __future__ import annotations

from collections.abc import Sequence

from heimdall_proxy.conductor.model import Namespace, Removed, Stored, Stream
from heimdall_proxy.conductor.tables import BlockMap, as_dict_map, new_map
from heimdall_proxy.kvcache.index.keys import (
    engine_entries,
    event_keys,
    flatten_keys,
    parent_of,
)
from heimdall_proxy.kvcache.index.stats import KVCacheStats

#: (namespace, our keys) a removal resolved to: one per namespace of the publisher
Targets = list[tuple[Namespace, list[int]]]


class EngineMaps:
    """publisher -> namespace -> engine hash -> our key(s), at most `max_keys` entries per
    publisher and namespace (the oldest written evicted first). Counts what it cannot
    resolve in `stats` (orphans, block size mismatches, unknown removals)."""

    def __init__(self, seed: int, max_keys: int, stats: KVCacheStats) -> None:
        self.seed = seed
        self.max_keys = max_keys
        self.stats = stats
        #: each a U64Map while its engine hashes are u64s and an engine block is one of
        #: ours (conductor.tables), else a DictMap
        self.maps: dict[str, dict[Namespace, BlockMap]] = {}

    def has(self, publisher: str) -> bool:
        """Whether `publisher` sent token ids with its own hashes (its removals name them)."""
        return publisher in self.maps

    def drop(self, publisher: str) -> None:
        self.maps.pop(publisher, None)

    def chained_stream(self, publisher: str, ev: Stored) -> Stream:
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
        maps = self.maps.get(publisher, {})
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

    def stored(self, publisher: str, ev: Stored) -> tuple[Stream, Sequence[int]] | None:
        """The stream and standard keys of a token-id `stored` event (`ev.token_ids` is not
        None), the map updated; None when it cannot be placed (an orphan: its parent is
        unknown; or an engine block size that is no multiple of the stream's), counted.

        Every vLLM block goes through here, on the loop or in an ingest worker: the usual
        case (the parent in the event's own namespace, or none) costs two probes of the map
        and one update, without the search of `chained_stream`."""
        maps = self.maps.get(publisher)
        if maps is None:
            maps = self.maps[publisher] = {}
        stream = ev.stream
        parent_hash = ev.parent_hash
        hashes = ev.seq_hashes
        emap = maps.get(stream.namespace)
        parent = None if emap is None or parent_hash is None else emap.get(parent_hash)
        if parent is None and (parent_hash is not None or (hashes and not ev.token_ids)):
            stream = self.chained_stream(publisher, ev)  # may be another salt's namespace
            emap = maps.get(stream.namespace)
            if emap is not None and parent_hash is not None:
                parent = emap.get(parent_hash)
        if emap is None:
            emap = maps[stream.namespace] = new_map()
        if hashes and hashes[0] in emap:
            known = list(map(emap.get, hashes))
            if None not in known:
                return stream, flatten_keys(known)  # stored elsewhere
        if not ev.token_ids:  # an offloading event: move what is known
            return stream, flatten_keys(v for v in map(emap.get, hashes) if v is not None)
        parent_key: int | None = None
        if parent_hash is not None:
            if parent is None:
                self.stats.orphan_events += 1
                return None
            parent_key = parent if type(parent) is int else parent_of(parent)
        ns = stream.namespace
        computed = event_keys(
            ev.token_ids,
            ev.engine_block_size or ns.block_size,
            len(hashes),
            ns.block_size,
            self.seed,
            parent_key,
        )
        if computed is None:
            self.stats.block_size_mismatch += 1
            return None
        keys, per = computed
        # fewer keys than hashes when the tokens stop short: only blocks with keys are mapped
        if per == 1:
            try:
                emap.set_many(hashes, keys)
            except OverflowError:  # an engine hash that is no u64: a DictMap takes any int
                emap = maps[ns] = as_dict_map(emap)
                emap.set_many(hashes, keys)  # again, whole: setting is idempotent
        else:  # an engine block spans several of ours: its entry is a tuple
            wide = as_dict_map(emap)
            wide.update(engine_entries(hashes, keys, per))
            emap = maps[ns] = wide
        if len(emap) > self.max_keys:
            emap.evict_oldest(self.max_keys)
        return stream, keys

    def removed(self, publisher: str, ev: Removed) -> Targets:
        """The keys a removal of engine hashes names, in whichever of the publisher's
        namespaces knows them; hashes none knows are counted."""
        targets: Targets = []
        resolved = 0
        for ns, emap in self.maps.get(publisher, {}).items():
            found = [v for v in map(emap.get, ev.seq_hashes) if v is not None]
            if found:
                resolved += len(found)
                targets.append((ns, flatten_keys(found)))
        self.stats.unknown_removals += max(0, len(ev.seq_hashes) - resolved)
        return targets
