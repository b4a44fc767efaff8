"""From a BlockStored event to our block keys: the part of ingest every backend shares.

Keys are this gateway's own block keys (kvcache.hashing), recomputed from the token ids the
event carries: vLLM's own hashes depend on its hash function and seed, so they are only used
to find our keys again when a block is removed (each pod has a map from its engine hashes to
our keys). An event whose parent block is unknown (events were missed) cannot be placed in
the chain and is dropped (counted as an orphan)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from heimdall_proxy.kvcache.hashing import block_keys, chain_keys
from heimdall_proxy.kvcache.index.base import StoredBlocks
from heimdall_proxy.kvcache.index.stats import KVCacheStats


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
        return block_keys(token_ids, block_size, seed, parent_key, n * per), per
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


def new_keys(
    event: StoredBlocks, block_size: int, parent_key: int | None, stats: KVCacheStats
) -> tuple[list[int], int] | None:
    """Our keys for a stored event that is not yet known, chained on `parent_key` (on the
    event's salted root when it starts a prompt), and how many of them each engine block
    spans; None (counted) when the engine's block size is not a multiple of ours."""
    computed = event_keys(
        event.token_ids,
        event.engine_block_size,
        len(event.engine_hashes),
        block_size,
        event.seed,
        event.root if event.parent_hash is None else parent_key,
        event.local_hashes,
    )
    if computed is None:
        stats.block_size_mismatch += 1
    return computed


def parent_of(entry: EngineEntry) -> int:
    """The key a child block chains on: the last of its parent engine block's keys."""
    return entry if isinstance(entry, int) else entry[-1]


def evict_oldest(d: dict[int, Any], max_keys: int) -> int:
    """Delete the oldest-written entries of `d` beyond `max_keys`, and 1/64th of `max_keys`
    more, so a full map evicts once per 1/64th rather than on every write; the number
    deleted (none when `d` is within bounds)."""
    if len(d) <= max_keys:
        return 0
    n = min(len(d), len(d) - max_keys + max(1, max_keys // 64))
    for key in list(islice(d, n)):
        del d[key]
    return n
