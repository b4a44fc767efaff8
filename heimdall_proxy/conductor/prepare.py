"""vLLM (and SGLang) batches decoded and rehashed in worker processes, off the event loop.

Rehashing a stored event to the standard keys is per-token and per-block work (msgpack
decode, XXH3 per block, the rolling chain one Python step per block) that the index does
not need to do itself. `ConductorPreparer` runs it in `processes` worker processes, each
its own single-process pool: a publisher's batches always go to the same one
(crc32 of its key), so a worker sees a publisher's whole stream in order.

For each BlockStored whose engine block size is a multiple of the publisher's registered
block size, the worker computes the local hashes of its tokens (in the registered block
size) and, when it can, the rolling keys too: from the root for an event without a parent,
or from the parent's key when the worker saw the parent stored (it remembers, per
publisher, the key each engine hash ended on; bounded by WORKER_MEMORY). It ships the
keys, the parent key it assumed and the local hashes as arrays of u64 (a bytes copy
pickles far faster than a list of ints), and drops the token ids.

The worker's memory is only a hint: the index (ConductorIndex.stored) takes the keys only
when the parent it knows for the event is that same key, else it chains the local hashes
itself. So a worker that missed a restart, a clear or an unregistration, or forgot a
parent, costs time, never correctness, and the index's answer is the inline path's.

A broken pool (a worker killed) falls back to decoding inline, as kvcache.prepare does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from heimdall_proxy.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    decode_payloads,
)
from heimdall_proxy.kvcache.hashing import chain_keys, local_hashes
from heimdall_proxy.kvcache.index.keys import evict_oldest
from heimdall_proxy.kvcache.prepare import BROKEN_BACKOFF, _worker_init

log = logging.getLogger(__name__)

Prepared = EventBatch | str
#: Engine hashes a worker remembers per publisher (the parents it can chain on).
WORKER_MEMORY = 65_536
#: publisher key -> its registered block size, None once it is not registered
BlockSizeOf = Callable[[str], int | None]

# The worker process's memory of each publisher's engine hashes -> the key each engine block
# ended on. It lives only in worker processes (module state there is the process's state);
# prepare_in_worker is the only writer.
_memory: dict[str, dict[int, int]] = {}


@dataclass(slots=True)
class PreparedStored(BlockStored):
    """A BlockStored as a worker prepared it: the token ids dropped for their `local`
    hashes in the publisher's block size and, when the worker could chain them, the rolling
    `keys` chained on `keys_parent` (None: the root)."""

    local: Sequence[int] | None = None
    keys: list[int] | None = None
    keys_parent: int | None = None


def prepare_stored(
    ev: BlockStored, block_size: int, seed: int, memory: dict[int, int] | None
) -> tuple[list[int], list[int] | None, int | None] | None:
    """(local hashes, keys or None, the parent key they chain on) of `ev`'s tokens (see the
    module docstring); `memory`: the publisher's engine hash -> key map to chain on and
    extend, None for local hashes only. None for an event that cannot be hashed (a block
    size mismatch, a token id outside u32): it is shipped as it is, for the index to count
    exactly as inline."""
    ebs = ev.block_size
    if not ev.token_ids or ebs <= 0 or ebs % block_size:
        return None
    n = min(len(ev.block_hashes), len(ev.token_ids) // ebs)
    tokens = ev.token_ids if len(ev.token_ids) == n * ebs else ev.token_ids[: n * ebs]
    try:
        local = local_hashes(tokens, block_size, seed)
    except (ValueError, OverflowError, TypeError):
        return None
    if memory is None or not local:
        return local, None, None
    if ev.parent_block_hash is None:
        parent = None
    else:
        parent = memory.get(ev.parent_block_hash)
        if parent is None:
            return local, None, None  # the index chains it, if it knows the parent
    keys = chain_keys(local, seed, parent)
    per = ebs // block_size
    memory.update(zip(ev.block_hashes, keys[per - 1 :: per], strict=False))
    evict_oldest(memory, WORKER_MEMORY)
    return local, keys, parent


def _u64s(values: Sequence[int]) -> bytes | list[int]:
    """u64 values as one bytes object; anything outside that range stays a list."""
    try:
        return array("Q", values).tobytes()
    except (OverflowError, TypeError):
        return list(values)


def _ints(packed: bytes | list[int]) -> list[int]:
    return array("Q", packed).tolist() if isinstance(packed, bytes) else packed


def _lazy(packed: bytes | list[int]) -> Sequence[int]:
    """An array over the bytes: its ints are made only if they are read (the index reads
    local hashes only when it cannot take the worker's keys)."""
    return array("Q", packed) if isinstance(packed, bytes) else packed


def _pack_event(ev: KVEvent, hashed: tuple[list[int], list[int] | None, int | None] | None
                ) -> tuple[Any, ...]:  # fmt: skip
    if type(ev) is BlockStored:
        if hashed is None:
            local = keys = parent = None
            tokens = ev.token_ids
        else:
            local = _u64s(hashed[0])
            keys = None if hashed[1] is None else _u64s(hashed[1])
            parent = hashed[2]
            tokens = []
        return (0, _u64s(ev.block_hashes), ev.parent_block_hash, tokens, ev.block_size,
                ev.lora_name, ev.medium, ev.lora_id, ev.cache_salt, local, keys,
                parent)  # fmt: skip
    if type(ev) is BlockRemoved:
        return (1, _u64s(ev.block_hashes), ev.medium)
    assert isinstance(ev, AllBlocksCleared)
    return (2, ev.medium)


def _unpack_event(t: tuple[Any, ...]) -> KVEvent:
    if t[0] == 0:
        _, hashes, parent, tokens, bs, lora_name, medium, lora_id, salt, local, keys, kp = t
        if local is None:
            return BlockStored(_ints(hashes), parent, tokens, bs, lora_name, medium, lora_id,
                               salt)  # fmt: skip
        return PreparedStored(_ints(hashes), parent, tokens, bs, lora_name, medium, lora_id,
                              salt, None, _lazy(local), None if keys is None else _ints(keys),
                              kp)  # fmt: skip
    if t[0] == 1:
        return BlockRemoved(_ints(t[1]), t[2])
    return AllBlocksCleared(t[1])


def unpack(packed: Iterable[Any]) -> list[Prepared]:
    """The worker's answer as batches (PreparedStored for the events it hashed)."""
    return [
        p
        if isinstance(p, str)
        else EventBatch(p[0], [_unpack_event(e) for e in p[3]], p[1], p[2], p[4])
        for p in packed
    ]


def prepare_in_worker(
    jobs: Sequence[tuple[str, int | None, bytes]], seed: int, memory: bool = True
) -> list[Any]:
    """The worker processes' entry point: (publisher, its block size, payload) -> the packed
    batches, in order. `memory`: chain on remembered parents (False: local hashes only)."""
    out: list[Any] = []
    for (pod, block_size, _), batch in zip(
        jobs, decode_payloads(p for _, _, p in jobs), strict=True
    ):
        if isinstance(batch, str):
            out.append(batch)
            continue
        mem = _memory.setdefault(pod, {}) if memory and block_size else None
        events = [
            _pack_event(
                ev,
                prepare_stored(ev, block_size, seed, mem)
                if block_size and type(ev) is BlockStored
                else None,
            )
            for ev in batch.events
        ]
        out.append((batch.ts, batch.dp_rank, batch.unknown, events, batch.invalid))
    return out


def forget_in_worker(pods: Sequence[str]) -> None:
    """Drop the worker's memory of `pods` (their publishers restarted or went away)."""
    for pod in pods:
        _memory.pop(pod, None)


class ConductorPreparer:
    """The subscriber's PrepareFor: batches decoded and hashed in `processes` worker
    processes, or only decoded inline without (processes=0, or a broken pool)."""

    def __init__(self, block_size_of: BlockSizeOf, seed: int, processes: int = 0) -> None:
        self.block_size_of = block_size_of
        self.seed = seed
        self.processes = max(0, processes)
        self._pools: list[ProcessPoolExecutor] = []
        self._broken_at = float("-inf")

    def start(self) -> None:
        """Spawn the worker processes now, not on the first batch; a machine that cannot
        gets batches decoded inline, and a warning."""
        if not self.processes or self._pools:
            return
        context = multiprocessing.get_context("spawn")
        pools = []
        try:
            for _ in range(self.processes):
                pool = ProcessPoolExecutor(1, mp_context=context, initializer=_worker_init)
                pools.append(pool)
                pool.submit(forget_in_worker, [])
        except (OSError, RuntimeError) as exc:
            log.warning("cannot start conductor ingest worker processes, decoding inline: %s", exc)
            for pool in pools:
                pool.shutdown(wait=False, cancel_futures=True)
            self._broken_at = time.monotonic()
            return
        self._pools = pools

    async def close(self) -> None:
        pools, self._pools = self._pools, []
        for pool in pools:
            await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)

    def _pool_of(self, pod: str) -> int:
        return zlib.crc32(pod.encode()) % len(self._pools)

    async def prepare(self, pods: list[str], payloads: list[bytes]) -> Iterable[Prepared]:
        """The batches of `payloads` (sent by `pods`), in order; an undecodable one is its
        error message."""
        if not payloads:
            return []
        stale = time.monotonic() - self._broken_at > BROKEN_BACKOFF
        if not self._pools and self.processes and stale:
            self.start()
        pools = self._pools
        if not pools:
            return decode_payloads(payloads)
        groups: dict[int, list[int]] = {}
        for i, pod in enumerate(pods):
            groups.setdefault(self._pool_of(pod), []).append(i)
        loop = asyncio.get_running_loop()
        try:
            results = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        pools[p],
                        prepare_in_worker,
                        [(pods[i], self.block_size_of(pods[i]), payloads[i]) for i in idx],
                        self.seed,
                    )
                    for p, idx in groups.items()
                )
            )
        except BrokenProcessPool:
            log.error("a conductor ingest worker process died; decoding batches inline for now")
            self._broken_at = time.monotonic()
            broken, self._pools = self._pools, []
            for pool in broken:
                pool.shutdown(wait=False, cancel_futures=True)
            return decode_payloads(payloads)
        out: list[Prepared | None] = [None] * len(payloads)
        for idx, packed in zip(groups.values(), results, strict=True):
            for i, batch in zip(idx, unpack(packed), strict=True):
                out[i] = batch
        return out  # type: ignore[return-value]  # every slot is filled

    def forget(self, pod: str) -> None:
        """Tell `pod`'s worker to drop its memory of it (fire and forget: the memory is a
        hint the index checks, so a late forget only costs time)."""
        if self._pools:
            with contextlib.suppress(RuntimeError, BrokenProcessPool):
                self._pools[self._pool_of(pod)].submit(forget_in_worker, [pod])
