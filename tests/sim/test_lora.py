"""LoRA adapters: the load cost, the slot limit and vllm:lora_requests_info."""

from __future__ import annotations

import asyncio

from tests.conftest import eventually
from tests.sim.conftest import Metrics, SimFactory


def _newest_lora_info(m: Metrics) -> dict[str, str]:
    samples = [(v, lab) for n, lab, v in m.samples if n == "vllm:lora_requests_info"]
    assert samples
    return max(samples, key=lambda s: s[0])[1]


async def test_loading_an_adapter_costs_time_once(sim: SimFactory) -> None:
    s = await sim(lora_modules=["sql", "chat"], max_loras=1, lora_load_time=0.5, time_scale=0.1)
    body = {"model": "sql", "prompt": "select", "max_tokens": 1}
    cold = await s.stream("/v1/completions", body)
    warm = await s.stream("/v1/completions", body)
    assert cold.ttft is not None and warm.ttft is not None
    assert cold.ttft >= 0.05  # 0.5 s load x 0.1
    assert warm.ttft < 0.03
    assert s.pod.engine.loras.loads == 1
    # one slot: the other adapter evicts it, and coming back loads it again
    await s.post("/v1/completions", {**body, "model": "chat"})
    again = await s.stream("/v1/completions", body)
    assert again.ttft is not None and again.ttft >= 0.05
    assert s.pod.engine.loras.loads == 3
    # the base model needs no adapter
    base = await s.stream("/v1/completions", {**body, "model": "sim-model"})
    assert base.ttft is not None and base.ttft < 0.03


async def test_requests_for_another_adapter_wait_for_a_free_slot(sim: SimFactory) -> None:
    s = await sim(lora_modules=["sql", "chat"], max_loras=1, lora_load_time=0.02)
    m = await s.metrics()
    assert _newest_lora_info(m) == {
        "max_lora": "1",
        "running_lora_adapters": "",
        "waiting_lora_adapters": "",
    }
    long = asyncio.create_task(
        s.post("/v1/completions", {"model": "sql", "prompt": "a", "max_tokens": 300})
    )
    await eventually(lambda: s.pod.running == 1)
    other = asyncio.create_task(
        s.post("/v1/completions", {"model": "chat", "prompt": "b", "max_tokens": 2})
    )
    base = asyncio.create_task(
        s.post("/v1/completions", {"model": "sim-model", "prompt": "c", "max_tokens": 2})
    )
    await base  # the base model is not held up by the adapter slot
    info = _newest_lora_info(await s.metrics())
    assert info["running_lora_adapters"] == "sql"
    assert info["waiting_lora_adapters"] == "chat"
    assert not other.done()
    await long
    status, doc = await other
    assert status == 200 and doc["choices"][0]["text"] == "the gateway"
    info = _newest_lora_info(await s.metrics())
    assert info["running_lora_adapters"] == info["waiting_lora_adapters"] == ""


async def test_no_lora_info_without_adapters(sim: SimFactory) -> None:
    s = await sim()
    m = await s.metrics()
    assert m.labels("vllm:lora_requests_info") == []
    assert m.labels("vllm:cache_config_info")[0]["num_gpu_blocks"] == "4096"
