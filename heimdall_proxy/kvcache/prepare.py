"""Preparing KV-event batches for the index, off the event loop.

Most of the CPU cost of ingest is per token, before the index is touched: msgpack-decoding a
batch and hashing each stored block's token ids. `prepare_batches` does that part: it decodes
each payload and, for every BlockStored whose engine block size is a multiple of ours,
computes the local hashes of its tokens in our block size with its namespace's seed
(`BlockStored.local_hashes`) and drops the token ids. What is left for the event loop is the
rolling chain (it starts from the parent block's key, which only the index knows) and the
index update, about half the work.

`EventPreparer` runs it in worker processes (spawned, so nothing of the gateway's loop or
sockets is inherited), one call per burst of batches a subscriber worker drained from its
queue. Without processes it only decodes, on the event loop, and the index hashes the
tokens of the blocks it does not know yet. Batches cross the process boundary in a compact
tuple form: dataclasses pickle several times slower. A broken pool (a worker killed) is
replaced on the next call, at most every BROKEN_BACKOFF seconds; meanwhile batches are
decoded inline, so none is lost.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
from array import array
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import lru_cache
from typing import Any

from heimdall_proxy.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    decode_payloads,
)
from heimdall_proxy.kvcache.hashing import local_hashes, namespace_seed, salt_root
from heimdall_proxy.kvcache.index import KVBlockIndex, StoredBlocks
from heimdall_proxy.kvcache.workers import BROKEN_BACKOFF, worker_init

log = logging.getLogger(__name__)

#: A payload that could not be decoded is returned as the decoder's message.
Prepared = EventBatch | str


def event_namespace(lora_name: str | None, lora_id: int | None, model_name: str) -> str:
    """The key namespace of a stored block: its LoRA adapter's name, an adapter known only
    by number (never matched by a request), or the base model."""
    if lora_name:
        return lora_name
    if lora_id is not None:
        return f"\x00lora-id:{lora_id}"
    return model_name


@lru_cache(maxsize=1024)
def cached_seed(namespace: str) -> int:
    """namespace_seed, remembered (a fleet has a handful of models and adapters)."""
    return namespace_seed(namespace)


def prepare_batches(payloads: Sequence[bytes], block_size: int, model_name: str) -> list[Prepared]:
    """Decode each payload and hash its stored blocks' tokens (see the module docstring); a
    batch's token ids are dropped before the next is decoded."""
    out: list[Prepared] = []
    for batch in decode_payloads(payloads):
        out.append(batch)
        if isinstance(batch, str):
            continue
        kept: list[KVEvent] = []
        for ev in batch.events:
            if type(ev) is BlockStored and ev.token_ids:
                ebs = ev.block_size
                if ebs <= 0 or ebs % block_size:
                    kept.append(ev)  # left for the index to count as a block-size mismatch
                    continue
                n = min(len(ev.block_hashes), len(ev.token_ids) // ebs) * ebs
                tokens = ev.token_ids if len(ev.token_ids) == n else ev.token_ids[:n]
                seed = cached_seed(event_namespace(ev.lora_name, ev.lora_id, model_name))
                try:
                    ev.local_hashes = local_hashes(tokens, block_size, seed)
                except (ValueError, OverflowError, TypeError):
                    batch.invalid += 1  # a malformed event: the others still apply
                    continue
                ev.token_ids = []
            kept.append(ev)
        batch.events = kept
    return out


async def apply_batch(index: KVBlockIndex, pod: str, batch: EventBatch, model_name: str) -> None:
    """Apply one (prepared or only decoded) batch of `pod`'s events to `index`; a remote
    index queues the writes until its next flush."""
    for ev in batch.events:
        try:
            if type(ev) is BlockStored:
                seed = cached_seed(event_namespace(ev.lora_name, ev.lora_id, model_name))
                root = None if ev.cache_salt is None else salt_root(ev.cache_salt, seed)
                await index.block_stored(
                    StoredBlocks(
                        pod,
                        ev.medium,
                        ev.block_hashes,
                        ev.parent_block_hash,
                        ev.token_ids,
                        ev.block_size,
                        seed,
                        ev.local_hashes,
                        root,
                    )
                )
            elif type(ev) is BlockRemoved:
                await index.block_removed(pod, ev.medium, ev.block_hashes)
            else:
                await index.flush()
                await index.cleared(pod)
        except (ValueError, OverflowError, TypeError) as exc:
            # One malformed event (a token id of -1, a hash wider than 64 bits) is counted
            # and skipped; the batch's other events, and other pods' batches, still apply.
            index.stats.invalid_events += 1
            log.debug("skipped a malformed KV event of %s: %r", pod, exc)


# ---- the compact form that crosses the process boundary -------------------------------------


def _u64s(values: list[int]) -> bytes | list[int]:
    """Unsigned 64-bit values as one bytes object (pickled as a copy, not value by value);
    anything outside that range stays a list."""
    try:
        return array("Q", values).tobytes()
    except OverflowError:
        return values


def _ints(packed: bytes | list[int]) -> list[int]:
    return array("Q", packed).tolist() if isinstance(packed, bytes) else packed


def _pack_event(ev: KVEvent) -> tuple[Any, ...]:
    if type(ev) is BlockStored:
        local = None if ev.local_hashes is None else _u64s(ev.local_hashes)
        return (0, _u64s(ev.block_hashes), ev.parent_block_hash, ev.token_ids, ev.block_size,
                ev.lora_name, ev.medium, ev.lora_id, local, ev.cache_salt)  # fmt: skip
    if type(ev) is BlockRemoved:
        return (1, _u64s(ev.block_hashes), ev.medium)
    assert isinstance(ev, AllBlocksCleared)
    return (2, ev.medium)


def _unpack_event(t: tuple[Any, ...]) -> KVEvent:
    if t[0] == 0:
        _, hashes, parent, tokens, bs, lora_name, medium, lora_id, local, salt = t
        ev = BlockStored(_ints(hashes), parent, tokens, bs, lora_name, medium, lora_id, salt)
        if local is not None:
            ev.local_hashes = _ints(local)
        return ev
    if t[0] == 1:
        return BlockRemoved(_ints(t[1]), t[2])
    return AllBlocksCleared(t[1])


def pack(prepared: Sequence[Prepared]) -> list[Any]:
    return [
        p
        if isinstance(p, str)
        else (p.ts, p.dp_rank, p.unknown, [_pack_event(e) for e in p.events], p.invalid)
        for p in prepared
    ]


def unpack(packed: Sequence[Any]) -> list[Prepared]:
    return [
        p
        if isinstance(p, str)
        else EventBatch(p[0], [_unpack_event(e) for e in p[3]], p[1], p[2], p[4])
        for p in packed
    ]


def _prepare_packed(payloads: Sequence[bytes], block_size: int, model_name: str) -> list[Any]:
    """The worker processes' entry point."""
    return pack(prepare_batches(payloads, block_size, model_name))


#: Overrides the default of `kvEventsConfig.decodeProcesses` (a config that sets it wins):
#: e.g. 0 where worker processes are not wanted (the test suite sets it).
DECODE_PROCESSES_ENV = "HEIMDALL_KV_DECODE_PROCESSES"


def default_processes() -> int:
    """One worker process when the machine has a CPU to spare, else none; or what
    HEIMDALL_KV_DECODE_PROCESSES says."""
    forced = os.environ.get(DECODE_PROCESSES_ENV, "").strip()
    if forced.isdigit():
        return int(forced)
    return 1 if (os.cpu_count() or 1) > 1 else 0


class EventPreparer:
    """Runs prepare_batches in `processes` worker processes; without (processes=0, or a
    broken pool) batches are only decoded, inline."""

    def __init__(self, block_size: int, model_name: str, processes: int = 0) -> None:
        self.block_size = block_size
        self.model_name = model_name
        self.processes = max(0, processes)
        self._pool: ProcessPoolExecutor | None = None
        self._broken_at = float("-inf")

    def start(self) -> None:
        """Create the pool and have its processes spawned now, not on the first batch. A
        machine that cannot spawn them gets batches decoded inline, and a warning."""
        if not self.processes or self._pool is not None:
            return
        try:
            pool = ProcessPoolExecutor(
                self.processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=worker_init,
            )
            for _ in range(self.processes):
                pool.submit(_prepare_packed, [], self.block_size, self.model_name)
        except (OSError, RuntimeError) as exc:  # BrokenProcessPool is a RuntimeError
            log.warning("cannot start KV-event worker processes, decoding inline: %s", exc)
            self._broken_at = time.monotonic()
            return
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)

    def inline(self, payloads: Sequence[bytes]) -> Iterable[Prepared]:
        """Without worker processes: only decode, and leave the hashing to the index, which
        skips it for blocks it already knows."""
        return decode_payloads(payloads)

    async def prepare(self, payloads: Sequence[bytes]) -> Iterable[Prepared]:
        """The batches of `payloads`, in order; an undecodable one is its error message."""
        if not payloads:
            return []
        pool = self._pool
        if pool is None and self.processes and time.monotonic() - self._broken_at > BROKEN_BACKOFF:
            self.start()
            pool = self._pool
        if pool is None:
            return self.inline(payloads)
        loop = asyncio.get_running_loop()
        try:
            packed = await loop.run_in_executor(
                pool, _prepare_packed, payloads, self.block_size, self.model_name
            )
        except BrokenProcessPool:
            log.error("a KV-event worker process died; decoding batches inline for now")
            self._broken_at = time.monotonic()
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            return self.inline(payloads)
        return unpack(packed)
