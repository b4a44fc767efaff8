"""token-producer: llm-d's backends. The vllm backend is tested against the simulator's
render routes over real HTTP (the same routes vLLM serves with --enable-scale-out)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from heimdall_proxy.framework.prefix import prefix_match_reader
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.plugins.requestcontrol.producers.token import TokenProducer, TokenProducerParams
from heimdall_proxy.tokenization.estimate import estimate_bytes, pack_bytes
from tests.conftest import GatewayFactory, PodFactory, make_config
from tests.helpers import free_port
from tests.plugins.helpers import req
from tests.plugins.requestcontrol.producers.test_tokenizer import model_dir  # noqa: F401 (fixture)

CHAT = {"messages": [{"role": "user", "content": "hello there, how are you today?"}]}


def make(**params: Any) -> TokenProducer:
    return TokenProducer("token-producer", TokenProducerParams.model_validate(params), None)  # type: ignore[arg-type]


async def sim_ids(url: str, body: dict[str, Any]) -> list[int]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/tokenize", json=body) as r:
        ids: list[int] = (await r.json())["tokens"]
        return ids


async def test_the_vllm_backend_gets_the_pods_own_ids(start_pod: PodFactory) -> None:
    pod = await start_pod()
    plugin = make(modelName="sim-model", vllm={"url": pod.url, "timeout": "2s"})
    assert plugin.backend == "vllm"
    try:
        chat = req("chat", CHAT, model="sim-model")
        await plugin.prepare_data(chat, [])
        assert chat.token_ids == await sim_ids(pod.url, CHAT)
        completion = req("completions", {"prompt": "the quick brown fox"}, model="sim-model")
        await plugin.prepare_data(completion, [])
        assert completion.token_ids == await sim_ids(pod.url, {"prompt": "the quick brown fox"})
        # idempotent: ids already there are kept
        completion.token_ids = [7, 8, 9]
        await plugin.prepare_data(completion, [])
        assert completion.token_ids == [7, 8, 9]
    finally:
        await plugin.stop()


async def test_a_render_that_fails_leaves_the_request_untokenized(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin = make(vllm={"url": f"http://127.0.0.1:{free_port()}"})
    try:
        request = req("chat", CHAT)
        with caplog.at_level(logging.WARNING):
            await plugin.prepare_data(request, [])
        assert request.token_ids is None
        assert plugin.failures == 1
        assert "request goes on untokenized" in caplog.text
    finally:
        await plugin.stop()


async def test_the_estimate_backend_is_the_default_and_makes_up_marked_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        plugin = make(estimate={"image": {"mode": "static"}})
    assert plugin.backend == "estimate" and make().backend == "estimate"
    assert "estimate settings ['image'] are accepted but not honoured" in caplog.text
    chat = req("chat", CHAT)
    await plugin.prepare_data(chat, [])
    assert chat.token_ids == pack_bytes(estimate_bytes("chat", CHAT))
    assert chat.token_ids_estimated
    # ids the client sent are real ones, passed on unmarked
    ids = req("completions", {"prompt": [11, 12, 13]})
    await plugin.prepare_data(ids, [])
    assert ids.token_ids == [11, 12, 13] and not ids.token_ids_estimated
    # idempotent: ids already there are kept, made-up or not
    chat.token_ids = [1, 2]
    await plugin.prepare_data(chat, [])
    assert chat.token_ids == [1, 2]


async def test_real_ids_replace_made_up_ones(start_pod: PodFactory) -> None:
    pod = await start_pod()
    estimate = make()
    vllm = make(modelName="sim-model", vllm={"url": pod.url})
    try:
        chat = req("chat", CHAT, model="sim-model")
        await estimate.prepare_data(chat, [])
        assert chat.token_ids_estimated
        await vllm.prepare_data(chat, [])
        assert chat.token_ids == await sim_ids(pod.url, CHAT)
        assert not chat.token_ids_estimated
        await estimate.prepare_data(chat, [])  # nor does an estimate replace real ids
        assert chat.token_ids == await sim_ids(pod.url, CHAT)
    finally:
        await vllm.stop()


def test_uds_is_deprecated_and_model_name_alone_loads_the_local_tokenizer(
    caplog: pytest.LogCaptureFixture,
    model_dir: Path,  # noqa: F811
) -> None:
    with caplog.at_level(logging.WARNING):
        uds = make(modelName="m", udsTokenizerConfig={"socketFile": "/tmp/none.sock"})
    assert uds.backend == "uds" and "udsTokenizerConfig is deprecated" in caplog.text
    assert make(modelName=str(model_dir)).backend == "local"
    with pytest.raises(ValueError, match=r"vllm\.url"):
        make(modelName="/no/such/model")


async def test_llm_d_shape_token_then_prefix_producer_serves(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(), await start_pod()]
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "token-producer",
             "parameters": {"modelName": "sim-model", "vllm": {"url": pods[0].url}}},
            {"type": "approx-prefix-cache-producer",
             "parameters": {"autoTune": False, "blockSizeTokens": 4}},
            {"type": "prefix-cache-scorer"},
            {"type": "max-score-picker"},
        ],
    }  # fmt: skip
    gw = await start_gateway(make_config(pods, doc))
    seen: dict[str, Any] = {}
    producer = gw.gateway.plugins.plugins["approx-prefix-cache-producer"]
    original = producer.produce

    async def spy(state: Any, request: Any, endpoints: Any) -> None:
        await original(state, request, endpoints)
        seen["ids"] = request.token_ids
        seen["info"] = prefix_match_reader("approx-prefix-cache-producer")(state)

    producer.produce = spy
    body = {"model": "sim-model", **CHAT, "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200
    ids = await sim_ids(pods[0].url, CHAT)
    assert seen["ids"] == ids
    assert seen["info"].total_blocks == len(ids) // 4  # blocks of real tokens


async def test_estimate_feeds_the_approximate_index_through_the_gateway(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """llm-d's default: a token-producer with no backend, read by the approximate producer;
    the made-up ids key its blocks, so a repeated prompt goes back to the pod that served it."""
    pods = [await start_pod(), await start_pod()]
    doc = {
        "plugins": [
            {"type": "token-producer"},
            {"type": "approx-prefix-cache-producer",
             "parameters": {"autoTune": False, "blockSizeTokens": 4}},
            {"type": "prefix-cache-scorer"},
            {"type": "max-score-picker"},
        ],
    }  # fmt: skip
    gw = await start_gateway(make_config(pods, doc))
    seen: list[Any] = []
    producer = gw.gateway.plugins.plugins["approx-prefix-cache-producer"]
    original = producer.produce

    async def spy(state: Any, request: Any, endpoints: Any) -> None:
        await original(state, request, endpoints)
        info = prefix_match_reader("approx-prefix-cache-producer")(state)
        seen.append((request.token_ids, request.token_ids_estimated, info))

    producer.produce = spy
    chat = {"messages": [{"role": "user", "content": "a long shared question " * 8}]}
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            body = {"model": "sim-model", **chat, "max_tokens": 1}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
    ids = pack_bytes(estimate_bytes("chat", chat))
    assert [(s[0], s[1]) for s in seen] == [(ids, True), (ids, True)]
    first, second = seen[0][2], seen[1][2]
    assert first.total_blocks == len(ids) // 4 and not first.matched_blocks
    assert max(second.matched_blocks.values()) == second.total_blocks  # the warmed pod


def test_registered() -> None:
    from heimdall_proxy.plugins.builtins import load_builtin_plugins

    registry: Registry = load_builtin_plugins()
    assert "token-producer" in registry
