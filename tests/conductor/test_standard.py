"""Publishers of standardized events (`type: Standard`) over real ZMQ: the envelope from the
events or the registration, event_id order per stream (duplicates dropped, gaps counted, a
stream that starts over restarted), engines with their own hashes, malformed events."""

from __future__ import annotations

from typing import Any

import msgpack
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestClient

from heimdall_proxy.conductor.app import CONDUCTOR
from heimdall_proxy.conductor.hashing import seq_hashes
from tests.conftest import eventually
from tests.helpers import BS, TOKENS, eventually_query, hits, post, q
from tests.kvcache.vllm_wire import Publisher, until_live

KEYS = seq_hashes(TOKENS, BS)


def ev(event_id: int, kind: str = "stored", **fields: Any) -> dict[str, Any]:
    return {"event_id": event_id, "timestamp": 1739145600000, "event_type": kind,
            "backend_id": "cache-daemon-1", "medium": "gpu", **fields}  # fmt: skip


async def send(pub: Publisher, *events: dict[str, Any]) -> None:
    await pub.publish(msgpack.packb(list(events)))


async def live(client: TestClient[Any, Any], pub: Publisher) -> None:
    body = {"endpoint": pub.endpoint, "replay_endpoint": f"tcp://127.0.0.1:{pub.port + 1}",
            "type": "standard", "modelname": "deepseek", "instance_id": "vllm-0",
            "block_size": BS, "dp_rank": 0}  # fmt: skip
    await post(client, "/register", body)
    received = client.app[CONDUCTOR].standard_subscriber.received
    await until_live(pub, received, "vllm-0|default|0", empty=msgpack.packb([]))


async def test_standardized_events(client: TestClient[Any, Any], ctx: zmq.asyncio.Context) -> None:
    pub = Publisher(ctx)
    conductor = client.app[CONDUCTOR]
    try:
        await live(client, pub)
        # a decoupled cache daemon's events are answered under the registered instance
        await send(pub, ev(1, seq_hashes=KEYS[:3], base_block_idx=0),
                   ev(1, seq_hashes=KEYS[:6], base_block_idx=0, medium="cpu"))  # fmt: skip
        await eventually_query(client, q(), "vllm-0", 24)
        doc = (await hits(client, q()))["default"]["vllm-0"]
        assert (doc["GPU"], doc["CPU"]) == (12, 24)
        # a duplicate event_id is dropped; a malformed event is skipped, the rest apply
        await send(pub, ev(1, "removed", seq_hashes=KEYS[:1]), ev(2, "stored"),
                   ev(2, seq_hashes=KEYS[3:5], parent_hash=KEYS[2]))  # fmt: skip
        await eventually_query(client, q(cache_salt=""), "vllm-0", 24)
        await eventually(lambda: conductor.order.duplicates == 1)
        assert conductor.stats.invalid_events == 1
        assert (await hits(client, q()))["default"]["vllm-0"]["GPU"] == 20
        # a gap in a stream's ids is counted
        await send(pub, ev(5, "removed", seq_hashes=[KEYS[4]]))
        await eventually(lambda: conductor.order.gaps == 1)
        assert conductor.order.missed == 2
        # the GPU stream starts over: its blocks are dropped, the CPU stream's kept
        await send(pub, ev(1, seq_hashes=KEYS[:1], base_block_idx=0))
        await eventually(lambda: conductor.order.restarts == 1)
        doc = (await hits(client, q()))["default"]["vllm-0"]
        assert (doc["GPU"], doc["CPU"]) == (4, 24)
        # cleared without a medium: every medium of the stream's namespace
        await send(pub, ev(2, "cleared", medium=None))
        await eventually_query(client, q(), "vllm-0", 0)
        # the envelope names another namespace: a LoRA adapter, a salt
        await send(pub, ev(3, seq_hashes=KEYS[:2], base_block_idx=0, lora_name="sql",
                           additional_salt="w8a8"))  # fmt: skip
        await eventually_query(client, q(lora_name="sql", cache_salt="w8a8"), "vllm-0", 8)
        assert (await hits(client, q(lora_name="sql")))["default"]["vllm-0"]["longest_matched"] == 0
        text = await (await client.get("/metrics")).text()
        assert 'conductor_feed_total{kind="duplicate_events"} 1.0' in text
        assert 'conductor_feed_total{kind="stream_restarts"} 1.0' in text
    finally:
        await pub.close()


async def test_an_engine_with_its_own_hashes_sends_token_ids(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    pub = Publisher(ctx)
    try:
        await live(client, pub)
        await send(pub, ev(1, seq_hashes=[71, 72], base_block_idx=0, token_ids=TOKENS[:8]))
        await send(pub, ev(2, seq_hashes=[73], parent_hash=72, base_block_idx=2,
                           token_ids=TOKENS[8:12]))  # fmt: skip
        await eventually_query(client, q(), "vllm-0", 12)
        await send(pub, ev(3, "removed", seq_hashes=[72]))
        await eventually_query(client, q(), "vllm-0", 4)
    finally:
        await pub.close()
