"""The conductor over real HTTP (aiohttp test server) fed by real ZMQ publishers sending
vLLM's msgpack batches: registration, queries by tokens and by hash, DP ranks, tiers,
tenants, salts and LoRA, gaps replayed, restarts, unregistering, bad input, metrics."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestClient

from heimdall_proxy.conductor.app import CONDUCTOR, create_app
from heimdall_proxy.conductor.hashing import seq_hashes
from heimdall_proxy.conductor.model import publisher_key
from heimdall_proxy.conductor.service import ServiceOptions
from tests.conftest import eventually
from tests.helpers import BS, TOKENS, eventually_query, hits, post, q, reference_seq_hashes
from tests.kvcache.vllm_wire import (
    Publisher,
    batch,
    cleared,
    removed,
    sglang_batch,
    stored,
    until_live,
)


@pytest.fixture
async def client(aiohttp_client: Any) -> TestClient[Any, Any]:
    app = create_app(ServiceOptions(replay_timeout=0.3, max_query_tokens=4096, max_instances=3))
    out: TestClient[Any, Any] = await aiohttp_client(app)
    return out


@pytest.fixture(params=[0, 1], ids=["inline", "worker"])
async def either_client(aiohttp_client: Any, request: Any) -> TestClient[Any, Any]:
    """`client`'s app, its vLLM batches resolved on the event loop or in a worker process
    (which then owns the engine-hash maps)."""
    options = ServiceOptions(replay_timeout=0.3, max_query_tokens=4096, max_instances=3)
    app = create_app(replace(options, ingest_workers=request.param))
    out: TestClient[Any, Any] = await aiohttp_client(app)
    return out


def reg(pub: Publisher, instance: str = "vllm-0", **extra: Any) -> dict[str, Any]:
    body = {
        "endpoint": pub.endpoint,
        "replay_endpoint": f"tcp://127.0.0.1:{pub.port + 1}",
        "type": "vLLM",
        "modelname": "deepseek",
        "instance_id": instance,
        "block_size": BS,
        "dp_rank": 0,
    }
    body.update(extra)
    return body


async def register(
    client: TestClient[Any, Any], pub: Publisher, empty: bytes | None = None, **kw: Any
) -> str:
    """Register `pub` and wait until its messages arrive (`empty`: the publisher's own empty
    batch, when it is not vLLM's)."""
    doc = await post(client, "/register", reg(pub, **kw))
    instance = kw.get("instance", "vllm-0")
    assert doc == {"status": "registered successfully", "instance_id": instance}
    key = publisher_key(instance, kw.get("tenant_id", "default"), kw.get("dp_rank", 0))
    await until_live(pub, client.app[CONDUCTOR].subscriber.received, key, empty=empty)
    return key


def engine_stored(start: int, n: int, parent: int | None = None, **kw: Any) -> dict[str, Any]:
    """n blocks of TOKENS from block `start`, with engine hashes 1000+i (not the standard)."""
    return stored(
        [1000 + i for i in range(start, start + n)],
        TOKENS[start * BS : (start + n) * BS],
        parent=parent,
        block_size=BS,
        **kw,
    )


async def test_register_query_and_hash_query(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    pub = Publisher(ctx)
    try:
        await register(client, pub)
        await pub.publish(batch([engine_stored(0, 3)], shape="array"))
        await pub.publish(batch([engine_stored(3, 2, parent=1002, medium="CPU")]))
        await eventually_query(client, q(), "vllm-0", 20)
        doc = await hits(client, q())
        # the CPU run only starts at block 3, so from the start of the prompt it is 0
        assert doc == {
            "default": {
                "vllm-0": {"longest_matched": 20, "GPU": 12, "CPU": 0, "DISK": 0, "DP": {"0": 20}}
            }
        }
        by_hash = await hits(
            client,
            {"model": "deepseek", "seq_hashes": reference_seq_hashes(TOKENS, BS, 1337)[:4],
             "block_size": BS},
            "/query_by_hash",
        )  # fmt: skip
        assert by_hash["default"]["vllm-0"]["longest_matched"] == 16
        legacy = await hits(
            client,
            {"model": "deepseek", "block_hash": seq_hashes(TOKENS, BS)[:2], "block_size": BS},
            "/query_by_hash",
        )
        assert legacy["default"]["vllm-0"]["longest_matched"] == 8
        # registering the same publisher again changes nothing
        await post(client, "/register", reg(pub))
        assert (await hits(client, q()))["default"]["vllm-0"]["longest_matched"] == 20
        # removal by engine hash
        await pub.publish(batch([removed([1001], medium=None)]))
        await eventually_query(client, q(), "vllm-0", 4)
    finally:
        await pub.close()


async def test_dp_ranks_tenants_salts_and_lora(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    pubs = [Publisher(ctx) for _ in range(4)]
    try:
        await register(client, pubs[0], dp_rank=0)
        await register(client, pubs[1], dp_rank=1)
        await register(client, pubs[2], instance="vllm-salted", additionalsalt="w8a8")
        await register(client, pubs[3], instance="vllm-t2", tenant_id="t2")
        await pubs[0].publish(batch([engine_stored(0, 2)], dp_rank=0))
        await pubs[1].publish(batch([engine_stored(0, 6)], dp_rank=1))
        await pubs[1].publish(batch([engine_stored(0, 3, lora_name="sql")], dp_rank=1))
        await pubs[2].publish(batch([engine_stored(0, 5)]))
        await pubs[3].publish(batch([engine_stored(0, 7)]))
        await eventually_query(client, q(), "vllm-0", 24)
        doc = (await hits(client, q()))["default"]
        assert doc["vllm-0"] == {
            "longest_matched": 24, "GPU": 24, "CPU": 0, "DISK": 0, "DP": {"0": 8, "1": 24}
        }  # fmt: skip
        # an instance registered with a salt answers only for that salt
        assert doc["vllm-salted"]["longest_matched"] == 0
        await eventually_query(client, q(cache_salt="w8a8"), "vllm-salted", 20)
        # LoRA blocks are their own namespace
        await eventually_query(client, q(lora_name="sql"), "vllm-0", 12)
        # tenants see only their own instances
        t2 = await hits(client, q(tenant_id="t2"))
        assert list(t2) == ["t2"] and list(t2["t2"]) == ["vllm-t2"]
        await eventually_query(client, q(tenant_id="t2"), "vllm-t2", 28)
        one = await hits(client, q(instance_id="vllm-0"))
        assert list(one["default"]) == ["vllm-0"]
        await post(client, "/query", q(instance_id="vllm-t2"), 404)
    finally:
        for p in pubs:
            await p.close()


async def test_gap_replay_restart_and_unregister(
    either_client: TestClient[Any, Any],
    ctx: zmq.asyncio.Context,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = either_client
    pub = Publisher(ctx, replay=True)
    conductor = client.app[CONDUCTOR]
    try:
        key = await register(client, pub)
        await pub.publish(batch([engine_stored(0, 1)]))
        await pub.publish(batch([engine_stored(1, 1, parent=1000)]), send=False)
        await pub.publish(batch([engine_stored(2, 1, parent=1001)]))
        await eventually_query(client, q(), "vllm-0", 12)
        assert conductor.stats.gaps == 1 and conductor.stats.replayed_batches == 1
        assert pub.replay_requests  # asked on the registered replay endpoint
        # a duplicate (an old sequence number) is ignored
        await pub.publish(batch([cleared()]), seq=pub.seq - 1)
        await pub.publish(batch([]))
        await eventually(lambda: conductor.stats.duplicate_batches == 1)
        assert (await hits(client, q()))["default"]["vllm-0"]["longest_matched"] == 12
        # the publisher starts over: its blocks are dropped
        await pub.publish(batch([engine_stored(0, 1)]), seq=0)
        await eventually_query(client, q(), "vllm-0", 4)
        assert conductor.stats.publisher_restarts == 1
        # ... and its engine hashes from before are unknown: a child of one is an orphan
        await pub.publish(batch([engine_stored(3, 1, parent=1002)]))
        await eventually(lambda: conductor.stats.orphan_events == 1)
        await pub.publish(batch([engine_stored(1, 1, parent=1000)]))
        await eventually_query(client, q(), "vllm-0", 8)
        await pub.publish(batch([removed([1001])]))
        await eventually_query(client, q(), "vllm-0", 4)
        # AllBlocksCleared
        await pub.publish(batch([cleared()]))
        await eventually_query(client, q(), "vllm-0", 0)
        await pub.publish(batch([engine_stored(0, 2)]))
        await eventually_query(client, q(), "vllm-0", 8)
        with caplog.at_level(logging.WARNING):
            doc = await post(
                client,
                "/unregister",
                {"instance_id": "vllm-0", "dp_rank": 0, "type": "vllm", "modelname": "other"},
            )
        assert doc == {"status": "unregistered successfully", "removed_instances": [key]}
        assert "modelname 'other' does not match the registration's 'deepseek'" in caplog.text
        assert "type 'vllm'" not in caplog.text  # the type is matched case-insensitively
        assert conductor.index.blocks_per_medium() == {}
        assert key not in conductor.subscriber.subscriptions()
        assert (await hits(client, q())) == {"default": {}}
        await post(client, "/unregister", {"instance_id": "vllm-0", "dp_rank": 0}, 404)
    finally:
        await pub.close()


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/register", b"{not json", 400, "invalid_json"),
        ("/register", b"[1, 2]", 400, "invalid_body"),
        ("/register", {"type": "vLLM"}, 400, "missing_field"),
        (
            "/register",
            {
                **{
                    "endpoint": "tcp://h:1",
                    "type": "vLLM",
                    "modelname": "m",
                    "instance_id": "i",
                    "dp_rank": 0,
                },
                "block_size": "16",
            },
            400,
            "invalid_field",
        ),
        (
            "/register",
            {
                "endpoint": "tcp://h:1",
                "type": "TensorRT",
                "modelname": "m",
                "instance_id": "i",
                "dp_rank": 0,
                "block_size": 16,
            },
            400,
            "unsupported_publisher",
        ),
        (
            "/register",
            {
                "endpoint": "h:1",
                "type": "vLLM",
                "modelname": "m",
                "instance_id": "i",
                "dp_rank": 0,
                "block_size": 16,
            },
            400,
            "invalid_field",
        ),
        (
            "/register",
            {
                "endpoint": "tcp://h:1",
                "type": "vLLM",
                "modelname": "m",
                "instance_id": "i",
                "dp_rank": -1,
                "block_size": 16,
            },
            400,
            "invalid_field",
        ),
        (
            "/register",
            {
                "endpoint": "tcp://h",
                "type": "vLLM",
                "modelname": "m",
                "instance_id": "i",
                "dp_rank": 0,
                "block_size": 16,
            },
            400,
            "invalid_field",
        ),
        (
            "/register",
            {
                "endpoint": "tcp://h:1",
                "replay_endpoint": "tcp://h:99999",
                "type": "vLLM",
                "modelname": "m",
                "instance_id": "i",
                "dp_rank": 0,
                "block_size": 16,
            },
            400,
            "invalid_field",
        ),
        ("/unregister", {"instance_id": "i"}, 400, "missing_field"),
        ("/query", {"model": "m", "block_size": 4}, 400, "missing_field"),
        ("/query", {"model": "m", "block_size": 0, "token_ids": [1]}, 400, "invalid_field"),
        ("/query", {"model": "m", "block_size": 4, "token_ids": [1, -2]}, 400, "invalid_field"),
        ("/query", {"model": "m", "block_size": 4, "token_ids": [1.5]}, 400, "invalid_field"),
        ("/query", {"model": "m", "block_size": 4, "token_ids": [2**32]}, 400, "invalid_field"),
        # booleans are ints to array(): the one-pass check must not let them through
        ("/query", {"model": "m", "block_size": 4, "token_ids": [True, 1]}, 400, "invalid_field"),
        ("/query", {"model": "m", "block_size": 4, "token_ids": ["1"]}, 400, "invalid_field"),
        ("/query", {"model": "m", "block_size": 4, "token_ids": [None]}, 400, "invalid_field"),
        (
            "/query_by_hash",
            {"model": "m", "block_size": 4, "seq_hashes": [False]},
            400,
            "invalid_field",
        ),
        (
            "/query",
            {"model": "m", "block_size": 4, "token_ids": [1] * 4097},
            413,
            "query_too_large",
        ),
        (
            "/query",
            {"model": "m", "block_size": 4, "token_ids": [1], "lora_name": "a", "lora_id": 1},
            400,
            "invalid_field",
        ),
        (
            "/query",
            {"model": "m", "block_size": 4, "token_ids": [1], "instance_id": "x"},
            404,
            "unknown_instance",
        ),
        (
            "/query_by_hash",
            {"model": "m", "block_size": 4, "seq_hashes": [2**64]},
            400,
            "invalid_field",
        ),
        ("/query_by_hash", {"model": "m", "block_size": 4}, 400, "missing_field"),
    ],
)
async def test_bad_input_gets_a_clear_4xx(
    client: TestClient[Any, Any], path: str, body: Any, status: int, code: str
) -> None:
    if isinstance(body, bytes):
        resp = await client.post(path, data=body, headers={"content-type": "application/json"})
    else:
        resp = await client.post(path, json=body)
    doc = await resp.json()
    assert resp.status == status
    assert doc["error"]["code"] == code and doc["error"]["message"]
    assert set(doc["error"]) == {"message", "type", "code"}
    assert (await client.get("/health")).status == 200  # still serving


async def test_output_is_bounded_per_tenant(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    pubs = [Publisher(ctx, replay=False) for _ in range(5)]
    try:
        for i, p in enumerate(pubs):
            await register(client, p, instance=f"i{i}")
        await pubs[4].publish(batch([engine_stored(0, 2)]))
        await eventually_query(client, q(), "i4", 8)
        resp = await client.post("/query", json=q())
        doc = await resp.json()
        assert list(doc["default"]) == ["i4", "i0", "i1"]  # longest first, at most 3
        assert resp.headers["x-conductor-omitted-instances"] == "2"
    finally:
        for p in pubs:
            await p.close()


async def test_health_and_metrics(client: TestClient[Any, Any], ctx: zmq.asyncio.Context) -> None:
    pub = Publisher(ctx)
    try:
        await register(client, pub)
        await pub.publish(batch([engine_stored(0, 2), engine_stored(2, 1, parent=1001,
                                                                    medium="CPU")]))  # fmt: skip
        await eventually_query(client, q(), "vllm-0", 12)
        assert await (await client.get("/health")).json() == {"status": "ok", "publishers": 1}
        text = await (await client.get("/metrics")).text()
        for line in (
            'conductor_events_total{type="stored"} 2.0',
            'conductor_blocks{medium="gpu"} 2.0',
            'conductor_blocks{medium="cpu"} 1.0',
            "conductor_publishers 1.0",
            'conductor_feed_total{kind="gaps"} 0.0',
            "conductor_query_duration_seconds_count",
            'conductor_event_lag_seconds{publisher="vllm-0|default|0"}',
        ):
            assert line in text, line
    finally:
        await pub.close()


async def test_without_a_replay_endpoint_a_gap_is_counted_not_replayed(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    """The replay socket is the registered one only: this publisher has a ROUTER on its
    port + 1 (where the gateway's subscriber would look), but none was registered."""
    pub = Publisher(ctx, replay=True)
    conductor = client.app[CONDUCTOR]
    try:
        body = reg(pub)
        del body["replay_endpoint"]
        await post(client, "/register", body)
        await until_live(pub, conductor.subscriber.received, "vllm-0|default|0")
        await pub.publish(batch([engine_stored(0, 1)]))
        await pub.publish(batch([engine_stored(1, 1, parent=1000)]), send=False)
        await pub.publish(batch([engine_stored(2, 1, parent=1001)]))
        await eventually(lambda: conductor.stats.missed_batches == 1)
        assert pub.replay_requests == [] and conductor.stats.orphan_events == 1
        assert (await hits(client, q()))["default"]["vllm-0"]["longest_matched"] == 4
    finally:
        await pub.close()


async def test_a_simulated_vllm_pods_own_events(
    client: TestClient[Any, Any], start_pod: Any
) -> None:
    """The simulator's publisher (vLLM's wire format, its own block hashes) feeds the
    conductor; a prompt the pod computed is then found by /query with its token ids."""
    sim = await start_pod(kv_events_port=-1, kv_events_replay_port=-1)
    endpoint, replay = sim.pod.kv_events_endpoint, sim.pod.kv_replay_endpoint
    assert endpoint and replay
    bs = sim.pod.options.block_size
    body = {"endpoint": endpoint, "replay_endpoint": replay, "type": "vLLM",
            "modelname": "sim-model", "instance_id": sim.name, "block_size": bs,
            "dp_rank": 0}  # fmt: skip
    await post(client, "/register", body)
    conductor = client.app[CONDUCTOR]
    prompt = list(range(5000, 5000 + bs * 8))
    query = {"model": "sim-model", "token_ids": prompt, "block_size": bs}
    async with aiohttp.ClientSession() as http:
        # a PUB drops what it sends before the SUB joined: clear the pod's prefix cache and
        # compute the prompt again until its events are seen
        for attempt in range(50):
            if attempt:
                async with http.post(f"{sim.url}/reset_prefix_cache") as r:
                    assert r.status == 200
            completion = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
            async with http.post(f"{sim.url}/v1/completions", json=completion) as r:
                assert r.status == 200
            await asyncio.sleep(0.1)
            if conductor.events.stored:
                break
        await eventually_query(client, query, sim.name, bs * 8)
    doc = await hits(client, query)
    assert doc["default"][sim.name]["GPU"] == bs * 8


async def test_a_requests_cache_salt_from_vllms_extra_keys(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    """vLLM folds a request's cache_salt into its first block's extra keys: the prompt is
    found with that salt only, its continuation (chained on the parent, no salt of its own)
    and its offloaded copy follow it there, and its removal is resolved."""
    pub = Publisher(ctx)
    try:
        await register(client, pub)
        first = engine_stored(0, 2, extra_keys=[["tenant-a"], None])
        await pub.publish(batch([first, engine_stored(2, 2, parent=1001)]))
        await pub.publish(batch([stored([1000, 1001], [], block_size=BS, medium="CPU")]))
        await eventually_query(client, q(cache_salt="tenant-a"), "vllm-0", 16)
        # the GPU run is whole after the first batch: wait for the offloading one as well
        await eventually(lambda: client.app[CONDUCTOR].events.stored == 3)
        doc = (await hits(client, q(cache_salt="tenant-a")))["default"]["vllm-0"]
        assert (doc["GPU"], doc["CPU"]) == (16, 8)
        assert (await hits(client, q()))["default"]["vllm-0"]["longest_matched"] == 0
        await pub.publish(batch([removed([1002])]))
        await eventually_query(client, q(cache_salt="tenant-a"), "vllm-0", 8)
    finally:
        await pub.close()


async def test_an_sglang_publisher_in_sglangs_own_shapes(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    """SGLang's first publisher (vLLM's frames, empty default topic, `[ts, events]` batches,
    BlockStored without medium, BlockRemoved with hashes only), registered per DP rank as
    SGLang does (a port per rank): stored chains, a gap replayed, removal, clear."""
    pub = Publisher(ctx, topic="")
    try:
        empty = sglang_batch([])
        await register(client, pub, empty, instance="sglang-0", type="SGLang", dp_rank=1)
        await pub.publish(sglang_batch([engine_stored(0, 3)]))
        await pub.publish(sglang_batch([engine_stored(3, 2, parent=1002)]))
        await eventually_query(client, q(), "sglang-0", 5 * BS)
        doc = await hits(client, q())
        assert doc["default"]["sglang-0"] == {
            "longest_matched": 5 * BS, "GPU": 5 * BS, "CPU": 0, "DISK": 0, "DP": {"1": 5 * BS}
        }  # fmt: skip
        missing = await pub.publish(sglang_batch([engine_stored(5, 1, parent=1004)]), send=False)
        await pub.publish(sglang_batch([engine_stored(6, 1, parent=1005)]))
        await eventually_query(client, q(), "sglang-0", 7 * BS)  # the gap, replayed
        await pub.publish(sglang_batch([removed([1001])]))
        await eventually_query(client, q(), "sglang-0", BS)
        await pub.publish(sglang_batch([cleared()]))
        await eventually_query(client, q(), "sglang-0", 0)  # still registered, holding nothing
        assert pub.replay_requests == [missing]
    finally:
        await pub.close()


async def test_a_current_sglang_publisher_with_salts_and_its_media(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    """SGLang as it publishes now: `[ts, events, attn_dp_rank]`, `medium` on its events
    (its CPU tier is CPU_PINNED), and a salted prompt's blocks as BlockStoredWithMetadata
    (`{"cache_salt": ...}` after `medium`, where vLLM has `lora_name`): the salt keys the
    chain as a request's cache_salt does, and is no LoRA adapter."""
    pub = Publisher(ctx, topic="")
    try:
        empty = sglang_batch([], current=True)
        await register(client, pub, empty, instance="sglang-1", type="SGLang")
        salted = engine_stored(0, 4, medium=None)
        await pub.publish(sglang_batch([salted], current=True, salt="tenant-a"))
        chained = engine_stored(4, 2, parent=1003, medium="GPU")  # inherits the salt
        await pub.publish(sglang_batch([chained], current=True, salt="tenant-a"))
        offloaded = stored([2000, 2001], TOKENS[: 2 * BS], block_size=BS, medium="CPU_PINNED")
        await pub.publish(sglang_batch([offloaded], current=True))
        await eventually_query(client, q(cache_salt="tenant-a"), "sglang-1", 6 * BS)
        # the third batch may still be on its way when the first two are in: waited for too
        await eventually_query(client, q(), "sglang-1", 2 * BS)
        doc = (await hits(client, q(cache_salt="tenant-a")))["default"]["sglang-1"]
        assert doc["GPU"] == 6 * BS and doc["CPU"] == 0
        plain = (await hits(client, q()))["default"]["sglang-1"]
        assert plain["longest_matched"] == 2 * BS and plain["CPU"] == 2 * BS
        assert plain["GPU"] == 0  # the salted blocks are not the unsalted prompt's
        await pub.publish(sglang_batch([removed([2000, 2001], medium="CPU_PINNED")], current=True))
        await eventually_query(client, q(), "sglang-1", 0)
        assert client.app[CONDUCTOR].stats.invalid_events == 0
    finally:
        await pub.close()


async def test_a_replay_address_zmq_refuses_is_no_replay_not_a_failed_subscription(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    """A gap whose replay address ZMQ refuses (the shape passes /register's check) is counted
    as missed, as with no replay socket; the subscription goes on."""
    pub = Publisher(ctx, replay=False)
    try:
        key = await register(client, pub, replay_endpoint="tcp://bad host:5558")
        await pub.publish(batch([engine_stored(0, 2)]))
        await pub.publish(batch([engine_stored(2, 1, parent=1001)]), send=False)  # lost
        await pub.publish(batch([engine_stored(3, 1)]))
        await eventually_query(client, q(TOKENS[3 * BS :]), "vllm-0", BS)
        sub = client.app[CONDUCTOR].subscriber
        assert sub.stats.missed_batches == 1
        assert any("refused" in r.getMessage() for r in caplog.records)
        assert not any("subscription of" in r.getMessage() for r in caplog.records)
        assert sub.received[key] >= 3
    finally:
        await pub.close()
