"""Worker-process ingest (conductor.prepare): real spawned worker processes, which own the
engine-hash maps of the publishers they serve, behind the real subscriber pipeline give
exactly the index, engine-hash maps and counters of decoding and resolving on the event
loop, whatever the batches hold; a batch prepared before its publisher's blocks were
dropped is prepared again; a dead worker's publishers are dropped, then served inline, then
by a new pool."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace
from typing import Any

import pytest
import zmq.asyncio
from aiohttp.test_utils import TestClient

from heimdall_proxy.conductor import prepare
from heimdall_proxy.conductor.app import CONDUCTOR, create_app
from heimdall_proxy.conductor.hashing import seq_hashes
from heimdall_proxy.conductor.model import Registration
from heimdall_proxy.conductor.prepare import PreparedBatch
from heimdall_proxy.conductor.service import Conductor, ServiceOptions
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
        # malformed events (a name or medium that is no string) skipped, the batch's others kept
        (
            c,
            batch(
                [
                    st([37], blocks(9, 1), lora_name=3),
                    removed([77], medium=5),
                    st([38], blocks(10, 1)),
                ]
            ),
        ),
    ]
    # many short chains, so bursts are prepared together and spread over both workers
    for i in range(40):
        pub = (a, c)[i % 2]
        out.append((pub, batch([st([100 + i], blocks(20 + i, 1), parent=4 if pub == a else 36)])))
    return out


async def ingest(
    workers: int, payloads: list[tuple[str, bytes]]
) -> tuple[Conductor, dict[str, Any]]:
    """The conductor after `payloads`, and its engine-hash maps (the workers' with
    workers)."""
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
            assert conductor.index.engines.maps == {}  # the workers own them
            maps = await conductor.preparer.maps()
        else:
            maps = conductor.index.engines.maps
    finally:
        await conductor.stop()
    return conductor, maps


def snapshot(conductor: Conductor, maps: dict[str, Any]) -> dict[str, Any]:
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
        "engine": maps,
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
    inline = snapshot(*await ingest(0, payloads))
    workers = snapshot(*await ingest(2, payloads))
    assert workers == inline
    stats = inline["stats"]
    # the script did reach every case
    assert (
        stats["orphan_events"] >= 2 and stats["invalid_events"] == 3
    )  # one token id outside u32, two malformed names
    assert stats["block_size_mismatch"] == 1 and stats["decode_errors"] == 1
    assert stats["unknown_removals"] == 1 and stats["removed_blocks"] == 1


async def test_a_batch_prepared_before_a_drop_is_prepared_again() -> None:
    """A publisher restarts between a batch's preparing (its parent known to the worker) and
    its applying: applied, it must be what the event loop would make of it after the drop,
    an orphan, and the worker's map must not keep the blocks it chained."""
    conductor = Conductor(ServiceOptions(ingest_workers=1))
    await conductor.start()
    try:
        a = reg("a")
        conductor.register(a)
        await conductor.subscriber.feed(a.key, batch([st([1, 2], blocks(0, 2))]))
        await conductor.subscriber.drain()
        ns = a.namespace()
        want = seq_hashes(T[: 4 * BS], BS)
        assert conductor.index.query(ns, want, ["a"])["a"].longest == 2
        (early,) = await conductor.preparer.prepare(
            [a.key], [batch([st([3, 4], blocks(2, 2), parent=2)])]
        )
        assert type(early) is PreparedBatch and early.ops  # resolved by the worker
        assert early.ops[0][2] is not None  # on the parent it knew
        await conductor.forget(a.key)  # the subscriber's verdict: the publisher restarted
        await conductor.apply(a.key, early)
        assert conductor.index.query(ns, want, ["a"]) == {}
        assert conductor.stats.orphan_events == 1
        assert await conductor.preparer.maps() == {a.key: {ns: {}}}  # as inline: nothing
        # the restarted publisher's new chain is resolved as usual
        await conductor.subscriber.feed(a.key, batch([st([9], blocks(0, 1))]))
        await conductor.subscriber.drain()
        assert conductor.index.query(ns, want, ["a"])["a"].longest == 1
    finally:
        await conductor.stop()


@pytest.mark.slow
async def test_a_killed_worker_drops_its_publishers_then_they_are_served_inline_and_again(
    aiohttp_client: Any, ctx: zmq.asyncio.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepare, "BROKEN_BACKOFF", 1.0)
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
        # the map of blocks 1, 2 died with the worker: they are dropped, and a child of
        # them is an orphan; a new chain is served inline
        await pub.publish(batch([st([3, 4], TOKENS[2 * BS : 4 * BS], parent=2)]))
        await pub.publish(batch([st([5], TOKENS[:BS])]))
        await eventually_query(client, q(), "vllm-0", BS)
        assert not conductor.preparer._pools  # replaced only after BROKEN_BACKOFF
        assert conductor.stats.orphan_events == 1
        assert conductor.index.engines.maps  # inline: the loop's own map
        await asyncio.sleep(1.1)
        # a new pool: the loop's maps are not its, so the blocks are dropped again, and the
        # new worker serves the publisher
        await pub.publish(batch([st([6, 7], TOKENS[: 2 * BS])]))
        await pub.publish(batch([st([8], TOKENS[2 * BS : 3 * BS], parent=7)]))
        await eventually_query(client, q(), "vllm-0", 3 * BS)
        assert len(conductor.preparer._pools) == 1
        assert conductor.index.engines.maps == {}
        assert await conductor.preparer.maps() != {}
    finally:
        await pub.close()


def test_ingest_workers_from_the_config_file(tmp_path: Any) -> None:
    from heimdall_proxy.conductor.settings import ConductorSettingsError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("ingestWorkers: 3\n")
    assert load_config(str(path)).options().ingest_workers == 3
    assert load_config(None).options().ingest_workers == 0
    path.write_text("ingestWorkers: -1\n")
    with pytest.raises(ConductorSettingsError, match="ingest"):
        load_config(str(path))
