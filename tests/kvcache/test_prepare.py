"""Preparing KV-event batches off the event loop: decoded and hashed in a worker process, fed
to the index with the same result as raw token ids, and no batch lost when a worker process
dies."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import AsyncIterator

import pytest

from heimdall_proxy.kvcache import prepare as prepare_module
from heimdall_proxy.kvcache.events import BlockStored, EventBatch, decode_batch, decode_payloads
from heimdall_proxy.kvcache.hashing import block_keys, local_hashes, namespace_seed
from heimdall_proxy.kvcache.index import InMemoryIndex, StoredBlocks
from heimdall_proxy.kvcache.prepare import (
    EventPreparer,
    event_namespace,
    pack,
    prepare_batches,
    unpack,
)
from tests.kvcache.vllm_wire import batch, cleared, removed, stored

BS = 4
MODEL = "m"
rng = random.Random(7)
TOKENS = [rng.randrange(200_000) for _ in range(10 * BS + 3)]  # 10 full blocks and a bit

PAYLOADS = [
    batch([stored([1, 2, 3, 4], TOKENS[: 4 * BS], block_size=BS)]),
    batch(
        [stored([5, 6, 7], TOKENS[4 * BS : 10 * BS], parent=4, block_size=2 * BS)],  # 2 per
        "array",
    ),
    batch([stored([8], TOKENS[:BS], block_size=BS, lora_name="ad", medium="CPU")]),
    batch([stored([9], TOKENS[:6], block_size=6)]),  # not a multiple of ours: left as is
    b"\xc1 not msgpack",
    batch([removed([2]), cleared()]),
    batch([stored([10, 11], [], block_size=BS)]),  # location only: nothing to hash
    batch([removed([-5, 2**64 - 1])]),  # a signed engine hash (older vLLM) travels as a list
]


def test_prepared_batches_carry_local_hashes_instead_of_tokens() -> None:
    got = prepare_batches(PAYLOADS, BS, MODEL)
    seed = namespace_seed(MODEL)
    first, second, lora, odd, bad, rest, location, _ = got
    assert isinstance(first, EventBatch) and isinstance(second, EventBatch)
    ev = first.events[0]
    assert isinstance(ev, BlockStored) and ev.token_ids == []
    assert ev.local_hashes == local_hashes(TOKENS[: 4 * BS], BS, seed)
    ev2 = second.events[0]
    assert isinstance(ev2, BlockStored)  # 3 engine blocks of 8 tokens, 6 of ours
    assert ev2.local_hashes == local_hashes(TOKENS[4 * BS : 10 * BS], BS, seed)
    ev3 = lora.events[0] if isinstance(lora, EventBatch) else None
    assert isinstance(ev3, BlockStored)
    assert ev3.local_hashes == local_hashes(TOKENS[:BS], BS, namespace_seed("ad"))
    ev4 = odd.events[0] if isinstance(odd, EventBatch) else None
    assert isinstance(ev4, BlockStored) and ev4.local_hashes is None and ev4.token_ids
    assert isinstance(bad, str) and "msgpack" in bad
    assert isinstance(rest, EventBatch) and rest.events == decode_batch(PAYLOADS[5]).events
    ev7 = location.events[0] if isinstance(location, EventBatch) else None
    assert isinstance(ev7, BlockStored) and ev7.local_hashes is None
    assert event_namespace(None, 3, MODEL) == "\x00lora-id:3"
    assert event_namespace(None, None, MODEL) == MODEL


def test_the_compact_form_round_trips() -> None:
    prepared = prepare_batches(PAYLOADS, BS, MODEL)
    assert unpack(pack(prepared)) == prepared


async def test_the_index_gets_the_same_keys_either_way() -> None:
    seed = namespace_seed(MODEL)
    raw, ready = InMemoryIndex(BS), InMemoryIndex(BS)
    for payload, prepared in zip(PAYLOADS, prepare_batches(PAYLOADS, BS, MODEL), strict=True):
        if isinstance(prepared, str):
            continue
        for ev, pev in zip(decode_batch(payload).events, prepared.events, strict=True):
            if isinstance(ev, BlockStored) and isinstance(pev, BlockStored):
                s = namespace_seed(event_namespace(ev.lora_name, ev.lora_id, MODEL))
                args = (ev.medium, ev.block_hashes, ev.parent_block_hash)
                raw.stored(StoredBlocks("p", *args, ev.token_ids, ev.block_size, s))
                ready.stored(
                    StoredBlocks("p", *args, pev.token_ids, pev.block_size, s, pev.local_hashes)
                )
    assert raw._tiers == ready._tiers and raw._engine == ready._engine
    assert raw.stats == ready.stats
    assert ready.match(block_keys(TOKENS, BS, seed), ["p"]) == {"p": 10.0}
    assert ready.stats.block_size_mismatch == 1


@pytest.fixture
async def preparer() -> AsyncIterator[EventPreparer]:
    p = EventPreparer(BS, MODEL, processes=1)
    p.start()
    yield p
    await p.close()


async def test_a_worker_process_hashes_and_inline_only_decodes(preparer: EventPreparer) -> None:
    assert list(await preparer.prepare(PAYLOADS)) == prepare_batches(PAYLOADS, BS, MODEL)
    assert list(await preparer.prepare([])) == []
    inline = EventPreparer(BS, MODEL, processes=0)
    assert list(await inline.prepare(PAYLOADS)) == list(decode_payloads(PAYLOADS))
    assert inline._pool is None


@pytest.mark.slow
async def test_a_killed_worker_loses_no_batch(preparer: EventPreparer) -> None:
    await preparer.prepare(PAYLOADS[:1])  # the worker is up
    pool = preparer._pool
    assert pool is not None
    for pid in list(pool._processes):  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(0.2)
    # the pool is broken: this call is decoded inline, the next after the backoff gets a
    # new pool
    assert list(await preparer.prepare(PAYLOADS)) == list(decode_payloads(PAYLOADS))
    assert preparer._pool is None
    preparer._broken_at -= 60
    assert list(await preparer.prepare(PAYLOADS)) == prepare_batches(PAYLOADS, BS, MODEL)
    assert preparer._pool is not None and preparer._pool is not pool


async def test_a_machine_that_cannot_spawn_decodes_inline(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A mock: a refused process spawn (out of process slots, a sandbox) cannot be produced
    # here without starving the whole test run, so the pool's constructor is made to fail.
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(prepare_module, "ProcessPoolExecutor", refuse)
    p = EventPreparer(BS, MODEL, processes=1)
    p.start()  # does not raise
    assert "cannot start KV-event worker processes" in caplog.text
    assert list(await p.prepare(PAYLOADS)) == list(decode_payloads(PAYLOADS))
    await p.close()


BAD_BATCH = batch(
    [
        stored([100], TOKENS[:BS], block_size=BS),
        stored([101], [-1, 2, 3, 4], parent=100, block_size=BS),  # a token id of -1
        stored([102], TOKENS[BS : 2 * BS], parent=100, block_size=BS),
    ]
)


@pytest.mark.parametrize("processes", [0, 1])
async def test_a_malformed_event_is_counted_and_skipped_and_its_batch_still_applies(
    processes: int,
) -> None:
    """Issue 14: one bad token id used to drop every event being applied, uncounted."""
    index = InMemoryIndex(BS)
    preparer = EventPreparer(BS, MODEL, processes)
    preparer.start()
    try:
        prepared = list(await preparer.prepare([BAD_BATCH, PAYLOADS[0]]))
    finally:
        await preparer.close()
    for b in prepared:
        assert isinstance(b, EventBatch)
        index.stats.invalid_events += b.invalid
        await prepare_module.apply_batch(index, "pod", b, MODEL)
    assert index.stats.invalid_events == 1
    seed = namespace_seed(MODEL)
    keys = block_keys(TOKENS[: 2 * BS], BS, seed)
    assert index.match(keys, ["pod"]) == {"pod": 2.0}  # blocks 100 and 102 made it
    assert index.match(block_keys(TOKENS[: 4 * BS], BS, seed), ["pod"]) == {"pod": 4.0}


def test_the_default_worker_count_can_be_set_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from heimdall_proxy.kvcache.prepare import DECODE_PROCESSES_ENV, default_processes

    monkeypatch.setenv(DECODE_PROCESSES_ENV, "2")
    assert default_processes() == 2
    monkeypatch.setenv(DECODE_PROCESSES_ENV, "0")
    assert default_processes() == 0
    monkeypatch.setenv(DECODE_PROCESSES_ENV, "many")  # not a count: the machine decides
    assert default_processes() in (0, 1)
