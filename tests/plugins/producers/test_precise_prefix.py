"""precise-prefix-cache-producer with a token-producer and the reader prefix-cache-scorer
(llm-d's shape): the simulated pods' own KV events on real ZMQ sockets bring a warmed prompt
back to its pod, as the seeds' precise-prefix-cache-scorer does."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from heimdall_proxy.plugins.producers.precise_prefix import PrecisePrefixCacheProducer
from heimdall_proxy.plugins.scorers.precise_prefix_params import (
    PrecisePrefixCacheParams,
    PrecisePrefixProducerParams,
)
from heimdall_proxy.plugins.scorers.prefix_cache import PrefixCacheReader
from tests.conftest import GatewayFactory, PodFactory, eventually
from tests.server.test_precise_routing import config, served_by, warm

PRODUCER = "precise-prefix-cache-producer"


def llm_d_epp(render_url: str) -> dict[str, Any]:
    return {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "token-producer",
             "parameters": {"modelName": "sim-model", "vllm": {"url": render_url}}},
            {"type": PRODUCER,
             "parameters": {"tokenProcessorConfig": {"blockSize": 16},
                            "kvEventsConfig": {"concurrency": 2}}},
            {"type": "prefix-cache-scorer",
             "parameters": {"prefixMatchInfoProducerName": PRODUCER}},
            {"type": "session-affinity-scorer"},
            {"type": "max-score-picker"},
            {"type": "single-profile-handler"},
        ],
        "schedulingProfiles": [
            {"name": "default",
             "plugins": [{"pluginRef": "max-score-picker"},
                         {"pluginRef": "prefix-cache-scorer", "weight": 10},
                         {"pluginRef": "session-affinity-scorer", "weight": 0.1}]},
        ],
    }  # fmt: skip


def test_parameters_need_no_tokenizer_pool_unlike_the_scorer() -> None:
    assert PrecisePrefixProducerParams().indexer_config.tokenizers_pool_config is None
    with pytest.raises(ValidationError, match="tokenizersPoolConfig is required"):
        PrecisePrefixCacheParams.model_validate({"indexerConfig": {}})


async def test_the_pods_own_events_bring_a_prompt_back_through_the_producer(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(kv_events_port=-1) for _ in range(3)]
    kv = [p.pod.kv_events_endpoint for p in pods]
    gw = await start_gateway(config(pods, kv, llm_d_epp(pods[0].url)))
    plugins = gw.gateway.plugins.plugins
    producer = plugins[PRODUCER]
    assert isinstance(producer, PrecisePrefixCacheProducer)
    assert isinstance(plugins["prefix-cache-scorer"], PrefixCacheReader)
    assert producer.ingest is not None
    ingest = producer.ingest
    await eventually(lambda: len(ingest.subscriber.subscriptions()) == 3)
    prompt = list(range(5000, 5000 + 16 * 8))  # 8 blocks of token ids
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
        await warm(http, pods[2], body, lambda: producer.stats.stored_blocks >= 8)
        for _ in range(3):
            assert await served_by(http, gw, prompt) == pods[2].name
        assert await served_by(http, gw, list(range(1, 129))) == pods[0].name  # cold: a tie


async def test_without_token_ids_the_producer_publishes_nothing(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(kv_events_port=-1)]
    doc = llm_d_epp(pods[0].url)
    doc["plugins"] = doc["plugins"][1:]  # no token-producer
    gw = await start_gateway(config(pods, [pods[0].pod.kv_events_endpoint], doc))
    producer = gw.gateway.plugins.plugins[PRODUCER]
    async with aiohttp.ClientSession() as http:
        assert await served_by(http, gw, "some text prompt " * 20) == pods[0].name
    assert producer.stats.lookups == 0  # type: ignore[attr-defined]
