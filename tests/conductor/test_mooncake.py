"""Mooncake Store's KV events (its subscriber guide's wire format) over real ZMQ: stored
replicas per medium, updates that copy or drop replicas, RemoveAllEvent, malformed events."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestClient

from heimdall_proxy.conductor.app import CONDUCTOR
from tests.conftest import eventually
from tests.helpers import BS, TOKENS, eventually_query, hits, post, q
from tests.kvcache.vllm_wire import Publisher, until_live


def store(i: int, replicas: list[list[str]], model: str = "") -> list[Any]:
    """Block i of TOKENS as Mooncake announces it (hashes are strings of its own)."""
    parent = "" if i == 0 else f"0x{i - 1:x}a"
    return ["BlockStoreEvent", f"key_{i}", replicas, model, BS, f"0x{i:x}a", parent,
            TOKENS[i * BS : (i + 1) * BS]]  # fmt: skip


async def send(pub: Publisher, *events: list[Any]) -> None:
    await pub.publish(msgpack.packb([time.time(), list(events)]))


MEM = ["memory", "tcp://10.0.0.9:6000"]
DISK = ["disk", "/data/blocks/b.bin"]


async def test_mooncake_store_events(
    client: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    pub = Publisher(ctx, topic="mooncake")
    conductor = client.app[CONDUCTOR]
    try:
        body = {"endpoint": pub.endpoint, "replay_endpoint": f"tcp://127.0.0.1:{pub.port + 1}",
                "type": "Mooncake", "modelname": "deepseek", "instance_id": "vllm-0",
                "block_size": BS, "dp_rank": 0}  # fmt: skip
        await post(client, "/register", body)
        received = conductor.mooncake_subscriber.received
        await until_live(pub, received, "vllm-0|default|0", empty=msgpack.packb([time.time(), []]))
        await send(pub, store(0, [MEM, DISK]), store(1, [MEM, DISK]), store(2, [MEM]),
                   ["BlockStoreEvent", "key_x"])  # fmt: skip
        await eventually_query(client, q(), "vllm-0", 12)
        doc = (await hits(client, q()))["default"]["vllm-0"]
        assert (doc["GPU"], doc["CPU"], doc["DISK"]) == (0, 12, 8)
        assert conductor.stats.invalid_events == 1
        # key_1 leaves memory (its disk copy stays); key_2 is copied to local disk
        await send(pub, ["BlockUpdateEvent", "key_1", [DISK]],
                   ["BlockUpdateEvent", "key_2", [MEM, ["local_disk", "tcp://h:7"]]])  # fmt: skip
        await eventually(lambda: conductor.stats.removed_blocks == 1)
        doc = (await hits(client, q()))["default"]["vllm-0"]
        assert (doc["CPU"], doc["DISK"], doc["longest_matched"]) == (4, 12, 12)
        await send(pub, ["RemoveAllEvent"])
        await eventually_query(client, q(), "vllm-0", 0)
        # a model named in the event is its namespace
        await send(pub, store(0, [MEM], model="other"))
        await eventually_query(client, {**q(), "model": "other"}, "vllm-0", 4)
    finally:
        await pub.close()
