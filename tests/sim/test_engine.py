"""The engine model: continuous batching, the waiting queue, chunked prefill, prefix caching,
preemption, KV usage and determinism, observed from outside as a router would."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.conftest import eventually
from tests.sim.conftest import SimFactory, prompt_of


async def test_queue_grows_under_a_burst(sim: SimFactory) -> None:
    s = await sim(max_num_seqs=2, time_scale=0.05)
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 20}
    tasks = [asyncio.create_task(s.post("/v1/completions", body)) for _ in range(8)]
    seen_waiting = 0.0
    while not all(t.done() for t in tasks):
        m = await s.metrics()
        running = m.value("vllm:num_requests_running", model_name="sim-model", engine="0")
        assert running <= 2
        seen_waiting = max(
            seen_waiting, m.value("vllm:num_requests_waiting", model_name="sim-model")
        )
        await asyncio.sleep(0.005)
    assert seen_waiting >= 4  # 8 requests, 2 slots
    results = [t.result() for t in tasks]
    assert all(status == 200 for status, _ in results)
    m = await s.metrics()
    assert m.value("vllm:num_requests_waiting") == 0
    assert m.value("vllm:request_success_total", finished_reason="length") == 8
    assert m.value("vllm:request_queue_time_seconds_count") == 8
    assert m.value("vllm:generation_tokens_total") == 8 * 20


async def test_a_repeated_prefix_is_not_prefilled_again(sim: SimFactory) -> None:
    # real time, so the gap between the two is ~100 ms, far above a busy machine's jitter
    s = await sim(time_scale=1.0)
    body = {"model": "sim-model", "prompt": prompt_of(1600), "max_tokens": 1}
    cold = await s.stream("/v1/completions", body)
    warm = await s.stream("/v1/completions", body)
    assert cold.ttft is not None and warm.ttft is not None
    # cold: 8 ms + 1601 tokens * 0.06 ms ~ 104 ms of GPU time; warm: one 8 ms step
    assert warm.ttft < cold.ttft / 3, (cold.ttft, warm.ttft)
    m = await s.metrics()
    assert m.value("vllm:prefix_cache_queries_total") == 2 * 1601
    assert m.value("vllm:prefix_cache_hits_total") == 1600  # 100 full blocks
    assert m.value("vllm:prompt_tokens_total") == 2 * 1601
    assert m.value("vllm:time_to_first_token_seconds_count") == 2
    _, doc = await s.post("/v1/completions", body)
    assert doc["usage"]["prompt_tokens_details"] == {"cached_tokens": 1600}


async def test_a_fed_back_reply_hits_the_cache_in_the_next_turn(sim: SimFactory) -> None:
    s = await sim()
    turn1 = [
        {"role": "system", "content": prompt_of(100)},
        {"role": "user", "content": "first question"},
    ]
    _, doc = await s.post(
        "/v1/chat/completions", {"model": "sim-model", "messages": turn1, "max_tokens": 40}
    )
    reply = doc["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "and"}]
    _, doc2 = await s.post(
        "/v1/chat/completions", {"model": "sim-model", "messages": turn2, "max_tokens": 1}
    )
    # every full block of turn 1 (prompt and the computed part of the reply) is reused
    computed_turn1 = doc["usage"]["prompt_tokens"] + 40 - 1
    assert doc2["usage"]["prompt_tokens_details"]["cached_tokens"] == computed_turn1 // 16 * 16


async def test_chunked_prefill_spreads_a_long_prompt_over_steps(sim: SimFactory) -> None:
    s = await sim(max_num_batched_tokens=256)
    before = s.pod.engine.stats.steps
    await s.post(
        "/v1/completions", {"model": "sim-model", "prompt": prompt_of(999), "max_tokens": 3}
    )
    # 1000 prompt tokens in chunks of 256: 4 steps, the 4th yields token 1; 2 decode steps
    assert s.pod.engine.stats.steps - before == 4 + 2


async def test_decoding_requests_keep_going_during_a_long_prefill(sim: SimFactory) -> None:
    s = await sim(max_num_batched_tokens=512, time_scale=0.05)
    short = asyncio.create_task(
        s.stream("/v1/completions", {"model": "sim-model", "prompt": "x", "max_tokens": 200})
    )
    await asyncio.sleep(0.02)
    long = {"model": "sim-model", "prompt": prompt_of(4000), "max_tokens": 1}
    t0 = time.perf_counter()
    await s.post("/v1/completions", long)
    t1 = time.perf_counter()
    out = await short
    # 4001 prompt tokens in chunks of 512 take 8 steps; each also decoded the short request
    during = sum(1 for t in out.times if t0 < t < t1)
    assert during >= 7, during


async def test_preemption_when_the_kv_cache_is_full(sim: SimFactory) -> None:
    # 12 blocks of 16 tokens; each request needs 3 blocks for its prompt and grows to 7
    s = await sim(num_gpu_blocks=12, max_num_seqs=8)
    bodies = [
        {"model": "sim-model", "prompt": prompt_of(40, salt=c), "max_tokens": 60} for c in "abcd"
    ]
    results = await asyncio.gather(*(s.post("/v1/completions", b) for b in bodies))
    expected = " ".join(["the gateway routes tokens to a pod with room and"] * 6)
    for status, doc in results:
        assert status == 200
        assert doc["choices"][0]["text"] == expected  # recomputed, same output
    m = await s.metrics()
    assert m.value("vllm:num_preemptions_total") > 0
    assert m.value("vllm:kv_cache_usage_perc") == 0.0
    assert s.pod.engine.pool.num_free == 12


async def test_kv_usage_counts_held_blocks_not_cached_ones(sim: SimFactory) -> None:
    s = await sim(num_gpu_blocks=100, time_scale=0.1)
    s.pod.hold = asyncio.Event()
    task = asyncio.create_task(
        s.stream(
            "/v1/completions", {"model": "sim-model", "prompt": prompt_of(319), "max_tokens": 120}
        )
    )
    await asyncio.sleep(0.03)
    m = await s.metrics()
    assert m.value("vllm:num_requests_running") == 1
    assert m.value("vllm:kv_cache_usage_perc") >= 0.20  # 20 prompt blocks of 100, growing
    s.pod.hold.set()
    await task
    m = await s.metrics()
    assert m.value("vllm:kv_cache_usage_perc") == 0.0
    assert s.pod.engine.pool.num_cached > 20  # freed, still cached


async def test_outputs_are_deterministic_under_a_seed(sim: SimFactory) -> None:
    a, b, c = await sim(seed=7), await sim(seed=7), await sim(seed=8)

    async def text(s: object, prompt: str, **extra: object) -> str:
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": 12, **extra}
        _, doc = await s.post("/v1/completions", body)  # type: ignore[attr-defined]
        return str(doc["choices"][0]["text"])

    first = await text(a, "tell me a story")
    assert first == await text(b, "tell me a story") == await text(a, "tell me a story")
    assert first != await text(c, "tell me a story")
    assert first != await text(a, "tell me a joke")
    assert first != await text(a, "tell me a story", seed=3)
    # no seed: the fixed reply the rest of the test suite expects
    plain = await sim()
    assert await text(plain, "tell me a story") == (
        "the gateway routes tokens to a pod with room and the gateway"
    )


async def test_shutdown_ends_requests_in_flight(sim: SimFactory) -> None:
    s = await sim(time_scale=1.0)
    long = {"model": "sim-model", "prompt": "x", "max_tokens": 5000}
    streamed = asyncio.create_task(s.stream("/v1/completions", long))
    plain = asyncio.create_task(s.post("/v1/completions", long))
    await eventually(lambda: s.pod.running == 2)
    t0 = time.perf_counter()
    await s.server.close()
    assert time.perf_counter() - t0 < 2  # 5000 tokens would take 40 s
    with pytest.raises(aiohttp.ClientPayloadError):
        await streamed
    status, doc = await plain
    assert status == 503 and doc["error"]["message"] == "the engine stopped"


@pytest.mark.slow
async def test_a_pod_the_host_held_up_catches_up_with_its_cost_model(sim: SimFactory) -> None:
    # 60 decode steps of 10 ms: 0.6 s by the cost model. The event loop is then blocked three
    # times for 90 ms (a shared CPU giving the pod no time). Without catching up the request
    # ends >= 0.87 s after it started; with it, by the model's 0.6 s plus at most the 0.1 s
    # of lag it may not make up. The margins are several times a busy machine's jitter.
    s = await sim(max_num_seqs=2, step_base=0.01, decode_cost_per_seq=0.0, time_scale=1.0)
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 61}
    start = time.monotonic()
    task = asyncio.create_task(s.post("/v1/completions", body))
    for _ in range(3):
        await asyncio.sleep(0.1)
        time.sleep(0.09)  # noqa: ASYNC251 -- blocks the loop, as a busy host would
    status, _ = await task
    assert status == 200
    assert time.monotonic() - start < 0.8
