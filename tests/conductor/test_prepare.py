"""Worker-process ingest (conductor.prepare): real spawned worker processes behind the real
subscriber pipeline give exactly the index, engine-hash maps and counters of decoding and
hashing on the event loop, whatever the batches hold; the index takes a worker's keys only
when they were chained on the parent it knows."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace
from typing import Any

import pytest
import zmq.asyncio
from aiohttp.test_utils import TestClient

from heimdall_proxy.conductor.app import CONDUCTOR, create_app
from heimdall_proxy.conductor.hashing import seq_hashes
from heimdall_proxy.conductor.index import ConductorIndex
from heimdall_proxy.conductor.model import Namespace, Registration, Stored, Stream
from heimdall_proxy.conductor.prepare import prepare_stored
from heimdall_proxy.conductor.service import Conductor, ServiceOptions
from heimdall_proxy.kvcache.events import BlockStored
from tests.conductor.test_app import register
from tests.helpers import BS, TOKENS, eventually_query, q
from tests.kvcache.vllm_wire import Publisher, batch, cleared, removed, stored

SEED = 1337
T = list(range(1000, 1000 + 64 * BS))  # 64 blocks of distinct tokens


def reg(instance: str, block_size: int = BS, tenant: str = "default") -> Registration:
    return Registration(
        "tcp://127.0.0.1:1", None, "vLLM", "m", "", tenant, instance, block_size, 0, ""
    )


def st(hashes: list[int], tokens: list[int], **kw: Any) -> dict[str, Any]:
    """A vLLM BlockStored of blocks of BS tokens unless `block_size` says otherwise."""
    kw.setdefault("block_size", BS)
    return stored(hashes, tokens, **kw)


def blocks(start: int, n: int, size: int = BS) -> list[int]:
    return T[start * size : (start + n) * size]


def script() -> list[tuple[str, bytes]]:
    """(publisher, payload) covering every case the workers treat differently."""
    a, b, c = reg("a").key, reg("b", 2 * BS).key, reg("c").key
    out = [
        # a: a chain over three batches, two events in one batch
        (a, batch([st([1, 2], blocks(0, 2)), st([3], blocks(2, 1), parent=2)])),
        (a, batch([st([4, 5], blocks(3, 2), parent=3)])),
        # engine blocks of 2*BS tokens = two of b's blocks each
        (b, batch([st([11, 12], blocks(0, 2, 2 * BS), block_size=2 * BS)])),
        (b, batch([st([13], blocks(2, 1, 2 * BS), parent=12, block_size=2 * BS)])),
        # a salted first block and its continuation; an offloaded copy (no tokens)
        (a, batch([st([21], blocks(10, 1), extra_keys=[["salt-x"]])])),
        (a, batch([st([22], blocks(11, 1), parent=21)])),
        (a, batch([st([21, 22], [], medium="CPU")])),
        # a block size that is no multiple of ours, a token id outside u32, an orphan
        (c, batch([st([31], blocks(0, 1, BS + 1), block_size=BS + 1)])),
        (c, batch([st([32], [-1] * BS), st([33], blocks(5, 1))])),
        (c, batch([st([34], blocks(6, 1), parent=999)])),
        (c, b"\x93not msgpack"),
        # removals (one unknown), then a's blocks all cleared and a child of a block the
        # worker remembers but the index forgot: an orphan either way
        (a, batch([removed([5, 77])])),
        (c, batch([cleared()])),
        (c, batch([st([35], blocks(7, 1), parent=33)])),
        (c, batch([st([36], blocks(8, 1))])),
    ]
    # many short chains, so bursts are prepared together and spread over both workers
    for i in range(40):
        pub = (a, c)[i % 2]
        out.append((pub, batch([st([100 + i], blocks(20 + i, 1), parent=4 if pub == a else 36)])))
    return out


async def ingest(workers: int, payloads: list[tuple[str, bytes]]) -> Conductor:
    conductor = Conductor(ServiceOptions(ingest_workers=workers))
    await conductor.start()
    try:
        for r in (reg("a"), reg("b", 2 * BS), reg("c")):
            conductor.register(r)
        for pod, payload in payloads:
            await conductor.subscriber.feed(pod, payload)
        await conductor.subscriber.drain()
        # a registration replaced: the worker's memory of it is void, the index's too
        conductor.register(replace(reg("a"), endpoint="tcp://127.0.0.1:2"))
        await conductor.subscriber.feed(reg("a").key, batch([st([6], blocks(5, 1), parent=4)]))
        await conductor.subscriber.drain()
        if workers:
            assert len(conductor.preparer._pools) == workers  # really in worker processes
    finally:
        await conductor.stop()
    return conductor


def snapshot(conductor: Conductor) -> dict[str, Any]:
    index = conductor.index
    stats = conductor.stats
    return {
        # which sources hold each key (bit numbers depend on which publisher came first)
        "spaces": {
            ns: {
                medium: {k: {src for src, bit in s.bits.items() if m & bit} for k, m in d.items()}
                for medium, d in s.media.items()
                if d
            }
            for ns, s in index.spaces.items()
        },
        "engine": index._engine,
        "events": conductor.events,
        "stats": {
            k: getattr(stats, k)
            for k in (
                "stored_blocks",
                "removed_blocks",
                "orphan_events",
                "invalid_events",
                "block_size_mismatch",
                "unknown_removals",
                "decode_errors",
                "batches",
            )
        },
    }


async def test_worker_processes_build_the_same_index_as_inline() -> None:
    payloads = script()
    inline = snapshot(await ingest(0, payloads))
    workers = snapshot(await ingest(2, payloads))
    assert workers == inline
    stats = inline["stats"]
    # the script did reach every case
    assert stats["orphan_events"] >= 2 and stats["invalid_events"] == 1
    assert stats["block_size_mismatch"] == 1 and stats["decode_errors"] == 1
    assert stats["unknown_removals"] == 1 and stats["removed_blocks"] == 1


def test_the_index_takes_a_workers_keys_only_on_the_parent_it_knows() -> None:
    ns = Namespace("m", BS, "", "", "default")
    stream = Stream(ns, "a", "gpu", 0)
    index = ConductorIndex(SEED)
    index.stored("p", Stored(stream, 1, [1], token_ids=TOKENS[:BS], engine_block_size=BS))
    ev = BlockStored([2, 3], 1, TOKENS[BS : 3 * BS], BS, None, None)
    memory = {1: 12345}  # the worker remembers a wrong key for the parent
    hashed = prepare_stored(ev, BS, SEED, memory)
    assert hashed is not None
    local, keys, parent = hashed
    assert parent == 12345 and keys is not None
    index.stored(
        "p",
        Stored(stream, 2, [2, 3], parent_hash=1, token_ids=[], engine_block_size=BS,
               local_hashes=local, keys=keys, keys_parent=parent),
    )  # fmt: skip
    want = seq_hashes(TOKENS[: 3 * BS], BS)
    assert index.query(ns, want, ["a"])["a"].longest == 3  # chained here, on the right parent
    assert index.query(ns, [want[0], *keys], ["a"])["a"].longest == 1  # not the worker's keys
    # the right parent: the worker's keys are the standard's
    memory = {1: want[0]}
    _, keys, _ = prepare_stored(BlockStored([2, 3], 1, TOKENS[BS : 3 * BS], BS, None, None),
                                BS, SEED, memory) or ([], None, None)  # fmt: skip
    assert keys == want[1:3] and memory == {1: want[0], 2: want[1], 3: want[2]}


async def test_a_killed_worker_falls_back_to_decoding_inline(
    aiohttp_client: Any, ctx: zmq.asyncio.Context
) -> None:
    client: TestClient[Any, Any] = await aiohttp_client(
        create_app(ServiceOptions(replay_timeout=0.3, ingest_workers=1))
    )
    conductor = client.app[CONDUCTOR]
    pub = Publisher(ctx)
    try:
        await register(client, pub)
        await pub.publish(batch([st([1, 2], TOKENS[: 2 * BS])]))
        await eventually_query(client, q(), "vllm-0", 2 * BS)
        (pool,) = conductor.preparer._pools
        (pid,) = pool._processes  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)  # a worker this test's conductor started
        await asyncio.sleep(0.2)
        await pub.publish(batch([st([3, 4], TOKENS[2 * BS : 4 * BS], parent=2)]))
        await eventually_query(client, q(), "vllm-0", 4 * BS)
        assert not conductor.preparer._pools  # replaced only after BROKEN_BACKOFF
    finally:
        await pub.close()


def test_ingest_workers_from_the_config_file(tmp_path: Any) -> None:
    from heimdall_proxy.conductor.settings import ConductorConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("ingestWorkers: 3\n")
    assert load_config(str(path)).options().ingest_workers == 3
    assert load_config(None).options().ingest_workers == 0
    path.write_text("ingestWorkers: -1\n")
    with pytest.raises(ConductorConfigError, match="ingest"):
        load_config(str(path))
