"""KV events over real ZMQ sockets, decoded with msgpack as a subscriber of vLLM would."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from heimdall_proxy.sim.kvcache import block_hash
from tests.sim.conftest import SimFactory, prompt_of, recv_batches, subscribe

BS = 16


def _stored(e: Any, fmt: str) -> dict[str, Any] | None:
    """A BlockStored event as a dict, whatever the wire form."""
    if fmt == "map":
        return e if e["type"] == "BlockStored" else None
    if e[0] != "BlockStored":
        return None
    keys = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")
    return {"type": e[0], **dict(zip((*keys, "medium", "lora_name"), e[1:], strict=True))}


def _removed(e: Any, fmt: str) -> dict[str, Any] | None:
    if fmt == "map":
        return e if e["type"] == "BlockRemoved" else None
    if e[0] != "BlockRemoved":
        return None
    return {"type": e[0], "block_hashes": e[1], "medium": e[2]}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["map", "array"])
async def test_stored_and_evicted_blocks_in_vllms_format(
    sim: SimFactory, zmq_ctx: zmq.asyncio.Context, fmt: str
) -> None:
    s = await sim(name="pod-a", num_gpu_blocks=8, kv_events_port=-1, kv_events_format=fmt)
    assert s.pod.kv_events_endpoint is not None
    sub = await subscribe(zmq_ctx, s.pod.kv_events_endpoint, b"kv@")
    try:
        text = prompt_of(47)  # + BOS: 48 tokens, 3 full blocks
        _, tok = await s.post("/tokenize", {"prompt": text})
        await s.post("/v1/completions", {"model": "sim-model", "prompt": text, "max_tokens": 1})
        got, events = await recv_batches(sub, lambda ev: any(_stored(e, fmt) for e in ev))
        topic, seq, batch = got[0]
        assert topic == b"kv@pod-a@sim-model"
        assert seq == 0
        ts, _, dp_rank = batch  # [ts, [events], data_parallel_rank]
        assert isinstance(ts, float) and dp_rank == 0
        stored = [x for e in events if (x := _stored(e, fmt))]
        assert len(stored) == 1
        ev = stored[0]
        hashes = ev["block_hashes"]
        assert len(hashes) == 3
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
        assert ev["parent_block_hash"] is None
        assert ev["token_ids"] == tok["tokens"]
        assert ev["block_size"] == BS
        assert ev["lora_id"] is None and ev["lora_name"] is None
        assert ev["medium"] == "GPU"
        # the hashes chain over token ids: a subscriber can recompute them
        h0 = block_hash(None, tok["tokens"][:BS])
        h1 = block_hash(h0, tok["tokens"][BS : 2 * BS])
        assert hashes == [h0, h1, block_hash(h1, tok["tokens"][2 * BS :])]

        # Fill the 8 blocks with other prompts: the cached blocks get evicted.
        for salt in "bcd":
            body = {"model": "sim-model", "prompt": prompt_of(63, salt=salt), "max_tokens": 1}
            await s.post("/v1/completions", body)
        _, events = await recv_batches(
            sub,
            lambda ev: (
                {h for e in ev if (r := _removed(e, fmt)) for h in r["block_hashes"]} >= set(hashes)
            ),
        )
        removed = [x for e in events if (x := _removed(e, fmt))]
        assert all(r["medium"] == "GPU" for r in removed)
    finally:
        sub.close()


@pytest.mark.slow
async def test_replay_answers_from_a_start_sequence(
    sim: SimFactory, zmq_ctx: zmq.asyncio.Context
) -> None:
    s = await sim(kv_events_port=-1)
    assert s.pod.kv_replay_endpoint is not None
    sub = await subscribe(zmq_ctx, s.pod.kv_events_endpoint or "")
    dealer = zmq_ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(s.pod.kv_replay_endpoint)
    try:
        for salt in "abc":
            body = {"model": "sim-model", "prompt": prompt_of(40, salt=salt), "max_tokens": 1}
            await s.post("/v1/completions", body)
        live, _ = await recv_batches(sub, lambda ev: len(ev) >= 3)
        live_payloads = {seq: batch for _, seq, batch in live}
        await dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        replayed: list[tuple[int, Any]] = []
        while True:
            empty, seq_bytes, payload = await dealer.recv_multipart()
            assert empty == b""
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == -1:
                assert payload == b""
                break
            replayed.append((seq, msgpack.unpackb(payload)))
        assert [seq for seq, _ in replayed] == sorted(live_payloads)[1:]
        for seq, batch in replayed:
            assert batch == live_payloads[seq]
    finally:
        sub.close()
        dealer.close()


@pytest.mark.slow
async def test_cpu_offload_tier(sim: SimFactory, zmq_ctx: zmq.asyncio.Context) -> None:
    s = await sim(num_gpu_blocks=40, cpu_offload_blocks=64, kv_events_port=-1, time_scale=1.0)
    sub = await subscribe(zmq_ctx, s.pod.kv_events_endpoint or "")
    try:
        first = {"model": "sim-model", "prompt": prompt_of(511, salt="a"), "max_tokens": 1}
        cold = await s.stream("/v1/completions", first)  # 32 blocks
        _, events = await recv_batches(sub, lambda ev: len(ev) >= 1)
        gpu_hashes = [h for e in events if e["type"] == "BlockStored" for h in e["block_hashes"]]
        assert len(gpu_hashes) == 32
        # two other prompts of 36 blocks take every GPU block: the first prompt's blocks
        # are evicted from the GPU and stored on the CPU tier
        for salt in "bc":
            other = {"model": "sim-model", "prompt": prompt_of(575, salt=salt), "max_tokens": 1}
            await s.post("/v1/completions", other)

        def offloaded(ev: list[Any]) -> bool:
            on_cpu = {
                h
                for e in ev
                if e["type"] == "BlockStored" and e["medium"] == "CPU"
                for h in e["block_hashes"]
            }
            return on_cpu >= set(gpu_hashes)

        _, events = await recv_batches(sub, offloaded)
        cpu_stored = [e for e in events if e["type"] == "BlockStored" and e["medium"] == "CPU"]
        assert all(len(e["token_ids"]) == len(e["block_hashes"]) * BS for e in cpu_stored)
        gpu_removed = {
            h
            for e in events
            if e["type"] == "BlockRemoved" and e["medium"] == "GPU"
            for h in e["block_hashes"]
        }
        assert gpu_removed >= set(gpu_hashes)
        # back from the CPU: cheaper than computing the prompt again, but not free
        warm = await s.stream("/v1/completions", first)
        assert cold.ttft is not None and warm.ttft is not None
        # cold: 8 ms + 512 x 0.06 ms = 39 ms; warm: 31 blocks x 0.2 ms, then one 9 ms step
        assert warm.ttft < cold.ttft * 0.7, (cold.ttft, warm.ttft)
        _, doc = await s.post("/v1/completions", first)
        assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 496
        assert s.pod.engine.pool.num_cpu > 0
    finally:
        sub.close()


@pytest.mark.slow
async def test_reset_prefix_cache_clears_all_blocks(
    sim: SimFactory, zmq_ctx: zmq.asyncio.Context
) -> None:
    s = await sim(kv_events_port=-1, kv_events_format="array", kv_events_hash="bytes")
    sub = await subscribe(zmq_ctx, s.pod.kv_events_endpoint or "")
    try:
        body = {"model": "sim-model", "prompt": prompt_of(40), "max_tokens": 1}
        await s.post("/v1/completions", body)
        _, events = await recv_batches(sub, lambda ev: len(ev) >= 1)
        assert events[0][0] == "BlockStored"
        assert all(isinstance(h, bytes) and len(h) == 32 for h in events[0][1])
        async with s.http.post(f"{s.url}/reset_prefix_cache") as r:
            assert r.status == 200
        _, events = await recv_batches(sub, lambda ev: ["AllBlocksCleared"] in ev)
        _, doc = await s.post("/v1/completions", body)
        assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        sub.close()


@pytest.mark.slow
async def test_lora_blocks_carry_the_adapter(sim: SimFactory, zmq_ctx: zmq.asyncio.Context) -> None:
    s = await sim(lora_modules=["a", "b"], max_loras=2, kv_events_port=-1)
    sub = await subscribe(zmq_ctx, s.pod.kv_events_endpoint or "")
    try:
        text = prompt_of(40)
        for model in ("a", "b", "sim-model"):
            await s.post("/v1/completions", {"model": model, "prompt": text, "max_tokens": 1})
        _, events = await recv_batches(sub, lambda ev: len(ev) >= 3)
        stored = [e for e in events if e["type"] == "BlockStored"]
        assert [(e["lora_name"], e["lora_id"]) for e in stored] == [
            ("a", 1),
            ("b", 2),
            (None, None),
        ]
        # the same tokens under different adapters are different blocks
        assert len({e["block_hashes"][0] for e in stored}) == 3
    finally:
        sub.close()
