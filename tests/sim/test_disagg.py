"""Disaggregated serving: the NIXL-style prefill/decode handshake and the encode role."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.sim.conftest import SimFactory, prompt_of

PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


async def test_prefill_then_decode(sim: SimFactory) -> None:
    prefill = await sim(name="p-0", role="prefill", advertise_host="10.0.0.7", time_scale=0.5)
    cold_decode = await sim(name="d-0", role="decode", time_scale=0.5)
    decode = await sim(name="d-1", role="decode", time_scale=0.5)
    request: dict[str, Any] = {
        "model": "sim-model",
        "prompt": prompt_of(1599),
        "max_tokens": 4,
    }
    # the prefill leg, as a P/D proxy sends it
    leg = {**request, "kv_transfer_params": PREFILL_PARAMS, "stream": False, "max_tokens": 1}
    status, doc = await prefill.post("/v1/completions", leg)
    assert status == 200
    assert doc["usage"]["completion_tokens"] == 1
    params = doc["kv_transfer_params"]
    assert params["do_remote_prefill"] is True
    assert params["do_remote_decode"] is False
    assert params["remote_engine_id"] == prefill.pod.engine_id
    assert params["remote_host"] == "10.0.0.7" and params["remote_port"] == 5600
    assert params["tp_size"] == 1
    assert len(params["remote_block_ids"]) == 1600 // 16
    assert all(isinstance(b, int) for b in params["remote_block_ids"])

    # the decode leg: the original request plus the prefill pod's kv_transfer_params
    pulled = await decode.stream("/v1/completions", {**request, "kv_transfer_params": params})
    cold = await cold_decode.stream("/v1/completions", request)
    assert pulled.ttft is not None and cold.ttft is not None
    # cold: 8 ms + 1600 x 0.06 ms; pulled: 100 blocks x 0.1 ms, then one 8 ms step (x 0.5)
    assert pulled.ttft < cold.ttft / 2, (pulled.ttft, cold.ttft)
    texts = [d["choices"][0]["text"] for d in pulled.data if d != "[DONE]" and d["choices"]]
    assert "".join(texts) == "the gateway routes tokens"
    m = await decode.metrics()
    assert m.value("vllm:prefix_cache_hits_total") == 0  # pulled, not found locally
    # the pulled blocks are now this pod's own cache
    _, again = await decode.post("/v1/completions", request)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 1584


IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


def _mm_chat(text: str) -> dict[str, Any]:
    content = [{"type": "text", "text": text}, IMAGE]
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}]}


async def test_encode_pod_and_remote_encoding(sim: SimFactory, tmp_path: Path) -> None:
    opts = {"encode_cost_per_item": 0.5, "time_scale": 0.1, "ec_storage_path": str(tmp_path)}
    encoder = await sim(name="e-0", role="encode", **opts)
    pd = await sim(name="pd-0", **opts)
    other_pd = await sim(name="pd-1", **{**opts, "ec_storage_path": None})

    # what the EPD proxy sends an encode instance: max_tokens 1, no stream
    status, doc = await encoder.post("/v1/chat/completions", {**_mm_chat(""), "max_tokens": 1})
    assert status == 200
    assert doc["choices"][0]["message"]["content"] == ""
    assert doc["usage"]["completion_tokens"] == 0
    ec = doc["ec_transfer_params"]
    [(mm_hash, item)] = ec.items()
    assert item["do_remote_encode"] is True
    assert item["num_encoder_tokens"] == 256
    assert item["remote_engine_id"] == encoder.pod.engine_id
    assert (tmp_path / mm_hash).exists()  # the shared EC storage

    # a pod that shares the storage finds the encoding there ...
    shared = await pd.stream("/v1/chat/completions", {**_mm_chat("what is it"), "max_tokens": 1})
    # ... one that does not encodes the image itself (0.5 s x 0.1), unless it is told
    cold = await other_pd.stream(
        "/v1/chat/completions", {**_mm_chat("what is it"), "max_tokens": 1}
    )
    told = await other_pd.stream(
        "/v1/chat/completions",
        {**_mm_chat("something else"), "max_tokens": 1, "ec_transfer_params": ec},
    )
    assert shared.ttft is not None and cold.ttft is not None and told.ttft is not None
    assert cold.ttft >= 0.05
    assert shared.ttft < 0.035 and told.ttft < 0.035, (shared.ttft, told.ttft)
    # the image's 256 placeholder tokens are part of the prompt
    _, tok = await pd.post("/tokenize", {"messages": _mm_chat("what is it")["messages"]})
    assert tok["count"] == 1 + 1 + 3 + 256 + 1 + 1


async def test_an_encoded_image_is_reused_locally(sim: SimFactory) -> None:
    s = await sim(encode_cost_per_item=0.5, time_scale=0.1)
    first = await s.stream("/v1/chat/completions", {**_mm_chat("one"), "max_tokens": 1})
    second = await s.stream("/v1/chat/completions", {**_mm_chat("two"), "max_tokens": 1})
    assert first.ttft is not None and second.ttft is not None
    assert first.ttft >= 0.05 > second.ttft
