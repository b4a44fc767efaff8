"""vLLM (and SGLang) batches decoded, rehashed and resolved in worker processes.

Turning a vLLM stored event into index keys is per-token and per-block work: msgpack
decode, XXH3 per block, the rolling chain one step per block, and the publisher's map from
engine hashes to standard keys (conductor.engine_map), read for the parent and written for
every block. With `processes` > 0, `ConductorPreparer` runs all of it in worker processes,
each its own single-process pool, and the worker owns the engine-hash maps of the
publishers it serves: a publisher's batches always go to the same worker (crc32 of its
key), which handles them in order, so the map evolves exactly as it would on the event
loop. The worker ships resolved operations (stream + standard keys as u64 arrays, removals
as (namespace, keys), clears); the event loop only sets and unsets bits in the index.

What changes a map outside the batches is ordered by a generation per publisher, kept by
the service: dropping a publisher's blocks (a restart, unregistering, a registration
replaced) bumps it. Every job carries the generation it was prepared under and a worker
that sees a newer one starts that publisher's map afresh; a batch prepared under an older
generation than the one current when it is applied is prepared again (the payload is kept
for that), as the event loop would have seen it after the drop. AllBlocksCleared, which
drops the map inline, is in the batch: the worker drops it at that point itself.

A worker that dies takes its maps with it: `on_lost` tells the service, which drops every
vLLM publisher's blocks (as for a restart; they are learned again from new events), and
batches are decoded inline, on the loop's own maps, until the pool is started again
(after BROKEN_BACKOFF seconds; the service drops them again then, since the loop's maps
are not the new workers')."""

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
from dataclasses import dataclass, field
from typing import Any

from heimdall_proxy.conductor import native_ingest
from heimdall_proxy.conductor.engine_map import EngineMaps
from heimdall_proxy.conductor.model import Cleared, Registration, Removed, Stored
from heimdall_proxy.conductor.normalise import StreamCache, from_vllm
from heimdall_proxy.conductor.wire import (
    Interned,
    RegistrationFields,
    namespace_fields,
    registration_fields,
    stream_fields,
)
from heimdall_proxy.kvcache.events import EventBatch, decode_payloads
from heimdall_proxy.kvcache.index.stats import KVCacheStats
from heimdall_proxy.kvcache.workers import BROKEN_BACKOFF, worker_init

log = logging.getLogger(__name__)

#: publisher key -> its registration, None once it is not registered
RegistrationOf = Callable[[str], Registration | None]
#: publisher key -> the generation of its blocks (bumped whenever they are dropped)
GenerationOf = Callable[[str], int]

#: Operation codes of a resolved batch (see PreparedBatch.ops).
STORED, REMOVED, CLEARED = 0, 1, 2


@dataclass(slots=True)
class PreparedBatch(EventBatch):
    """A batch prepared under `generation` of its publisher, with its `payload` kept to
    prepare it again should that generation be over when it is applied.

    `ops` is None for a batch decoded on the event loop (its `events` are applied there, on
    the loop's engine-hash maps); else a worker resolved it, in order:
    `(STORED, stream, keys)` (keys: u64 bytes, None when the event was not placed),
    `(REMOVED, stream, [(namespace, keys)])`, `(CLEARED, event)`, streams and namespaces
    as conductor.wire's tuples; with what the worker counted: orphans, block size
    mismatches, unknown removals, malformed events."""

    generation: int = 0
    payload: bytes = b""
    ops: list[tuple[Any, ...]] | None = None
    orphans: int = 0
    mismatches: int = 0
    unknown_removals: int = 0
    bad_events: int = 0


# ---- the worker process's side ---------------------------------------------------------------
# Module state in a worker process is that process's: the engine-hash maps of the
# publishers it serves, the generation each was built under, their streams.
_maps: EngineMaps | None = None
_generations: dict[str, int] = {}
_streams: dict[str, StreamCache] = {}
_interned = Interned()


def _worker_maps(seed: int, max_keys: int) -> EngineMaps:
    global _maps
    if _maps is None or _maps.seed != seed or _maps.max_keys != max_keys:
        _maps = EngineMaps(seed, max_keys, KVCacheStats())
        _generations.clear()
        _streams.clear()
    return _maps


def _start_over(maps: EngineMaps, pod: str, generation: int) -> None:
    """Forget `pod`'s map unless it was built under `generation` (which becomes its own)."""
    if _generations.get(pod) != generation:
        maps.drop(pod)
        _streams.pop(pod, None)
        _generations[pod] = generation


def _u64s(values: Sequence[int]) -> bytes:
    return array("Q", values).tobytes()


def _resolve(maps: EngineMaps, pod: str, reg: Registration, batch: EventBatch) -> tuple[Any, ...]:
    """One decoded batch of `pod` as (ts, dp_rank, unknown, invalid, ops, orphans,
    mismatches, unknown removals, malformed events): Conductor.apply_events's work up to the
    index, with this process's maps."""
    stats = maps.stats
    orphans, mismatches, unknown = (
        stats.orphan_events, stats.block_size_mismatch, stats.unknown_removals
    )  # fmt: skip
    ops: list[tuple[Any, ...]] = []
    append = ops.append
    stored = maps.stored
    bad = 0
    streams = _streams.get(pod)
    if streams is None:
        streams = _streams[pod] = {}
    for ev in from_vllm(reg, batch, streams=streams):
        try:
            if type(ev) is Stored:
                resolved = stored(pod, ev)
                if resolved is None:
                    append((STORED, stream_fields(ev.stream), None))
                else:
                    keys = array("Q", resolved[1]).tobytes()
                    append((STORED, stream_fields(resolved[0]), keys))
            elif type(ev) is Removed:
                targets = [(namespace_fields(ns), _u64s(k)) for ns, k in maps.removed(pod, ev)]
                ops.append((REMOVED, stream_fields(ev.stream), targets))
            elif type(ev) is Cleared:
                if ev.all_namespaces and ev.all_media:
                    maps.drop(pod)  # as ConductorIndex.cleared drops it inline
                ops.append((CLEARED, ev))
        except (ValueError, OverflowError, TypeError):
            bad += 1  # one malformed event; the others apply
            fields = stream_fields(ev.stream)
            ops.append((STORED, fields, None) if type(ev) is Stored else (REMOVED, fields, []))
    return (
        batch.ts, batch.dp_rank, batch.unknown, batch.invalid, ops,
        stats.orphan_events - orphans, stats.block_size_mismatch - mismatches,
        stats.unknown_removals - unknown, bad,
    )  # fmt: skip


def prepare_in_worker(
    pods: Sequence[str],
    generations: Sequence[int],
    payloads: Sequence[bytes],
    regs: dict[str, RegistrationFields | None],
    seed: int,
    max_keys: int,
) -> list[Any]:
    """The worker processes' entry point: the payloads of `pods` under `generations` -> the
    resolved batches (or an undecodable payload's error message), in order; `regs`: the
    publishers' registrations as conductor.wire's tuples (None: no longer registered, the
    batch is decoded only). Three lists rather than a tuple per job: less to pickle."""
    maps = _worker_maps(seed, max_keys)
    registrations = {
        pod: None if fields is None else _interned.registration(fields)
        for pod, fields in regs.items()
    }
    out: list[Any] = []
    for pod, generation, batch in zip(pods, generations, decode_payloads(payloads), strict=True):
        if _generations.get(pod) != generation:
            _start_over(maps, pod, generation)
        reg = registrations.get(pod)
        if isinstance(batch, str):
            out.append(batch)
        elif reg is None:
            out.append((batch.ts, batch.dp_rank, batch.unknown, batch.invalid, [], 0, 0, 0, 0))
        else:
            out.append(_resolve(maps, pod, reg, batch))
    return out


def forget_in_worker(pod: str, generation: int) -> None:
    """Free `pod`'s map unless it was built under `generation` or later (its publisher went
    away: no job of it may come to say so)."""
    if _maps is not None and _generations.get(pod, -1) < generation:
        _maps.drop(pod)
        _streams.pop(pod, None)
        _generations.pop(pod, None)


def worker_maps() -> dict[str, Any]:
    """The worker's engine-hash maps (tests compare them with the event loop's)."""
    return {} if _maps is None else _maps.maps


def _unpacked(packed: Any, generation: int, payload: bytes) -> PreparedBatch | str:
    if isinstance(packed, str):
        return packed
    ts, rank, unknown, invalid, ops, orphans, mismatches, unknown_removals, bad = packed
    return PreparedBatch(
        ts, [], rank, unknown, invalid, generation, payload, ops, orphans, mismatches,
        unknown_removals, bad,
    )  # fmt: skip


# ---- the event loop's side ------------------------------------------------------------------


@dataclass
class ConductorPreparer:
    """The subscriber's PrepareFor: batches resolved in `processes` worker processes, or
    decoded inline without them (processes=0, or a broken pool). `on_lost`: the engine-hash
    maps moved between the workers and the loop (a worker died, or the pool came back):
    the service drops what they resolved."""

    registration_of: RegistrationOf
    generation_of: GenerationOf
    seed: int
    max_keys: int
    processes: int = 0
    on_lost: Callable[[], None] = lambda: None
    _pools: list[ProcessPoolExecutor] = field(default_factory=list)
    _broken_at: float = float("-inf")
    _was_broken: bool = False

    def __post_init__(self) -> None:
        self.processes = max(0, self.processes)

    def start(self) -> None:
        """Spawn the worker processes now, not on the first batch; a machine that cannot
        gets batches decoded inline, and a warning."""
        if not self.processes or self._pools:
            return
        context = multiprocessing.get_context("spawn")
        pools = []
        try:
            for _ in range(self.processes):
                pool = ProcessPoolExecutor(1, mp_context=context, initializer=worker_init)
                pools.append(pool)
                pool.submit(worker_maps)
        except (OSError, RuntimeError) as exc:
            log.warning("cannot start conductor ingest worker processes, decoding inline: %s", exc)
            for pool in pools:
                pool.shutdown(wait=False, cancel_futures=True)
            self._broken_at = time.monotonic()
            self._was_broken = True
            return
        self._pools = pools
        if self._was_broken:  # the loop resolved batches meanwhile, on its own maps
            self._was_broken = False
            self.on_lost()

    async def close(self) -> None:
        pools, self._pools = self._pools, []
        for pool in pools:
            await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)

    def _pool_of(self, pod: str) -> int:
        return zlib.crc32(pod.encode()) % len(self._pools)

    def _inline(self, pods: list[str], payloads: list[bytes]) -> Iterable[EventBatch | str]:
        if not self.processes:  # plain batches are applied in C (conductor.native_ingest)
            return map(native_ingest.prepare, payloads)
        generation_of = self.generation_of
        return (
            batch
            if isinstance(batch, str)
            else PreparedBatch(
                batch.ts,
                batch.events,
                batch.dp_rank,
                batch.unknown,
                batch.invalid,
                generation_of(pod),
                payload,
            )
            for pod, payload, batch in zip(pods, payloads, decode_payloads(payloads), strict=True)
        )

    def _broken(self) -> None:
        log.error("a conductor ingest worker process died; decoding batches inline for now")
        self._broken_at = time.monotonic()
        self._was_broken = True
        broken, self._pools = self._pools, []
        for pool in broken:
            pool.shutdown(wait=False, cancel_futures=True)
        self.on_lost()

    async def prepare(self, pods: list[str], payloads: list[bytes]) -> Iterable[EventBatch | str]:
        """The batches of `payloads` (sent by `pods`), in order; an undecodable one is its
        error message."""
        if not payloads:
            return []
        stale = time.monotonic() - self._broken_at > BROKEN_BACKOFF
        if not self._pools and self.processes and stale:
            self.start()
        pools = self._pools
        if not pools:
            return self._inline(pods, payloads)
        generations = [self.generation_of(pod) for pod in pods]
        groups: dict[int, list[int]] = {}
        if len(pools) == 1:
            groups[0] = list(range(len(pods)))
        else:
            for i, pod in enumerate(pods):
                groups.setdefault(self._pool_of(pod), []).append(i)
        regs: dict[str, RegistrationFields | None] = {}
        for pod in set(pods):
            reg = self.registration_of(pod)
            regs[pod] = None if reg is None else registration_fields(reg)
        loop = asyncio.get_running_loop()
        try:
            results = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        pools[p],
                        prepare_in_worker,
                        [pods[i] for i in idx],
                        [generations[i] for i in idx],
                        [payloads[i] for i in idx],
                        {pods[i]: regs[pods[i]] for i in idx},
                        self.seed,
                        self.max_keys,
                    )
                    for p, idx in groups.items()
                )
            )
        except BrokenProcessPool:
            self._broken()
            return self._inline(pods, payloads)
        out: list[EventBatch | str | None] = [None] * len(payloads)
        for idx, packed in zip(groups.values(), results, strict=True):
            for i, one in zip(idx, packed, strict=True):
                out[i] = _unpacked(one, generations[i], payloads[i])
        return out  # type: ignore[return-value]  # every slot is filled

    async def again(self, pod: str, payload: bytes) -> EventBatch | str:
        """One batch prepared again, under its publisher's current generation."""
        (batch,) = await self.prepare([pod], [payload])
        return batch

    def forget(self, pod: str) -> None:
        """Tell `pod`'s worker to free its map (fire and forget: a later job of `pod`
        starts it afresh anyway, by its generation)."""
        if self._pools:
            with contextlib.suppress(RuntimeError, BrokenProcessPool):
                self._pools[self._pool_of(pod)].submit(
                    forget_in_worker, pod, self.generation_of(pod)
                )

    async def maps(self) -> dict[str, Any]:
        """Every worker's engine-hash maps, merged (tests)."""
        out: dict[str, Any] = {}
        for pool in self._pools:
            out.update(await asyncio.wrap_future(pool.submit(worker_maps)))
        return out


def ints(packed: bytes) -> list[int]:
    """u64 bytes from a worker as ints."""
    return array("Q", packed).tolist()
