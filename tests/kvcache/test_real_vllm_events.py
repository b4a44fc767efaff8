"""The decoder, the index and the subscriber on KV events captured from a real vLLM 0.32 pod
(tests/fixtures/README.md): 40 BlockStored and 7 BlockRemoved events, block size 32."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.asyncio

from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.kvcache.events import BlockRemoved, BlockStored, EventBatch, decode_batch
from heimdall_proxy.kvcache.hashing import block_keys, namespace_seed
from heimdall_proxy.kvcache.index import InMemoryIndex, StoredBlocks
from heimdall_proxy.kvcache.subscriber import KVEventsSubscriber, SubscriberOptions
from tests.conftest import eventually
from tests.kvcache.vllm_wire import Publisher, batch, until_live

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SEED = namespace_seed("tiny-llama")


def stream() -> list[tuple[bytes, int, bytes]]:
    frames = msgpack.unpackb((FIXTURES / "vllm_kv_events_real_stream.msgpack").read_bytes())
    return [(topic, int.from_bytes(seq, "big"), payload) for topic, seq, payload in frames]


def held_at_the_end(batches: list[EventBatch]) -> set[int]:
    """The engine hashes the pod holds once every event is applied."""
    held: set[int] = set()
    for b in batches:
        for ev in b.events:
            if isinstance(ev, BlockStored):
                held.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                held.difference_update(ev.block_hashes)
    return held


def test_single_captured_batches_decode() -> None:
    stored = decode_batch((FIXTURES / "vllm_kv_events_real.bin").read_bytes())
    (ev,) = stored.events
    assert isinstance(ev, BlockStored)
    assert (len(ev.block_hashes), ev.block_size, ev.medium, len(ev.token_ids)) == (
        8,
        32,
        "GPU",
        256,
    )
    removed = decode_batch((FIXTURES / "vllm_kv_events_real_removed.bin").read_bytes())
    assert isinstance(removed.events[0], BlockRemoved) and stored.unknown == removed.unknown == 0


@pytest.mark.parametrize("block_size", [32, 16])
async def test_the_captured_stream_replays_without_orphans(block_size: int) -> None:
    batches = [decode_batch(payload) for _, _, payload in stream()]
    kinds = [type(e).__name__ for b in batches for e in b.events]
    assert (kinds.count("BlockStored"), kinds.count("BlockRemoved")) == (40, 7)
    index = InMemoryIndex(block_size)
    for b in batches:
        for ev in b.events:
            if isinstance(ev, BlockStored):
                await index.block_stored(StoredBlocks("vllm-0", ev.medium, ev.block_hashes,
                                         ev.parent_block_hash, ev.token_ids, ev.block_size, SEED))  # fmt: skip
            elif isinstance(ev, BlockRemoved):
                await index.block_removed("vllm-0", ev.medium, ev.block_hashes)
    s = index.stats
    assert (s.orphan_events, s.unknown_removals, s.block_size_mismatch) == (0, 0, 0)
    per = 32 // block_size
    assert s.removed_blocks == 7 * per
    # every prompt vLLM cached from its root is found again from its own tokens
    held = held_at_the_end(batches)
    roots = [
        e
        for b in batches
        for e in b.events
        if isinstance(e, BlockStored) and e.parent_block_hash is None
    ]
    assert roots
    for ev in roots:
        keys = block_keys(ev.token_ids, block_size, SEED)
        run = 0
        for h in ev.block_hashes:
            if h not in held:
                break
            run += per
        assert index.match(keys, ["vllm-0"]).get("vllm-0", 0.0) >= run


async def test_the_captured_stream_through_a_subscriber(ctx: zmq.asyncio.Context) -> None:
    frames = stream()
    pub = Publisher(ctx, replay=True, topic=frames[0][0].decode())
    endpoint = Endpoint("vllm-0", "http://127.0.0.1:1", "127.0.0.1", 1, kv_events=pub.endpoint)

    class Pool:
        def endpoints(self) -> list[Endpoint]:
            return [endpoint]

        def get(self, name: str) -> Endpoint | None:
            return endpoint

    index = InMemoryIndex(32)

    async def apply(pod: str, got: EventBatch) -> None:
        for ev in got.events:
            if isinstance(ev, BlockStored):
                await index.block_stored(StoredBlocks(pod, ev.medium, ev.block_hashes, ev.parent_block_hash,
                                         ev.token_ids, ev.block_size, SEED))  # fmt: skip
            elif isinstance(ev, BlockRemoved):
                await index.block_removed(pod, ev.medium, ev.block_hashes)

    sub = KVEventsSubscriber(SubscriberOptions(), Pool(), apply, index.cleared, index.stats)
    await sub.start()
    try:
        await until_live(pub, sub.received, "vllm-0")
        # the capture, re-sequenced after the probes; every fifth message lost on the way
        for i, (_, _, payload) in enumerate(frames):
            await pub.publish(payload, send=i % 5 != 3)
        await pub.publish(batch([]))  # reveals a gap at the very end too
        await eventually(lambda: index.stats.removed_blocks == 7)
        await sub.drain()
        assert index.stats.gaps >= 1 and index.stats.missed_batches == 0
        assert (index.stats.orphan_events, index.stats.unknown_removals) == (0, 0)
    finally:
        await sub.stop()
        await pub.close()
