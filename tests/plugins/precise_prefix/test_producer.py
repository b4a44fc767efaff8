"""precise-prefix-cache-producer with a token-producer and the reader prefix-cache-scorer
(llm-d's shape): the simulated pods' own KV events on real ZMQ sockets bring a warmed prompt
back to its pod, as the seeds' precise-prefix-cache-scorer does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_reader
from heimdall_proxy.plugins.precise_prefix.params import (
    PrecisePrefixCacheParams,
    PrecisePrefixProducerParams,
)
from heimdall_proxy.plugins.precise_prefix.producer import PrecisePrefixCacheProducer
from heimdall_proxy.plugins.precise_prefix.scorer import PrecisePrefixCacheScorer
from heimdall_proxy.plugins.scheduling.scorers.prefix_cache import PrefixCacheScorer
from tests.conftest import GatewayFactory, PodFactory, eventually
from tests.server.test_precise_routing import config, model_dir, served_by, warm  # noqa: F401

PRODUCER = "precise-prefix-cache-producer"
SCORER = "precise-prefix-cache-scorer"


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


@pytest.mark.slow
async def test_the_pods_own_events_bring_a_prompt_back_through_the_producer(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(kv_events_port=-1) for _ in range(3)]
    kv = [p.pod.kv_events_endpoint for p in pods]
    gw = await start_gateway(config(pods, kv, llm_d_epp(pods[0].url)))
    plugins = gw.gateway.plugins.plugins
    producer = plugins[PRODUCER]
    assert isinstance(producer, PrecisePrefixCacheProducer)
    assert isinstance(plugins["prefix-cache-scorer"], PrefixCacheScorer)
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


@pytest.mark.parametrize(
    "token_producer", [None, {"type": "token-producer"}], ids=["none", "estimate"]
)
@pytest.mark.slow
async def test_without_real_token_ids_the_producer_publishes_nothing(
    start_pod: PodFactory, start_gateway: GatewayFactory, token_producer: dict[str, Any] | None
) -> None:
    """No token-producer, or llm-d's default estimate one whose made-up ids never match an
    engine's blocks: nothing is looked up, the request is served all the same."""
    pods = [await start_pod(kv_events_port=-1)]
    doc = llm_d_epp(pods[0].url)
    doc["plugins"] = ([token_producer] if token_producer else []) + doc["plugins"][1:]
    gw = await start_gateway(config(pods, [pods[0].pod.kv_events_endpoint], doc))
    producer = gw.gateway.plugins.plugins[PRODUCER]
    async with aiohttp.ClientSession() as http:
        assert await served_by(http, gw, "some text prompt " * 20) == pods[0].name
    assert producer.stats.lookups == 0  # type: ignore[attr-defined]


@pytest.mark.slow
async def test_the_producer_matches_what_the_seeds_scorer_matches(
    start_pod: PodFactory,
    start_gateway: GatewayFactory,
    model_dir: Path,  # noqa: F811
) -> None:
    """Both plugins in one gateway, each following the same pods' real KV events: for every
    request they publish the same per-pod matches (the one index code, two owners here only
    because the config declares both)."""
    pods = [await start_pod(kv_events_port=-1) for _ in range(3)]
    kv = [p.pod.kv_events_endpoint for p in pods]
    doc = llm_d_epp(pods[0].url)
    seed_params = {
        "tokenProcessorConfig": {"blockSize": 16},
        "indexerConfig": {"tokenizersPoolConfig": {"modelName": str(model_dir), "workersCount": 1}},
        "kvEventsConfig": {"concurrency": 2},
    }
    doc["plugins"].append({"type": SCORER, "parameters": seed_params})
    doc["schedulingProfiles"][0]["plugins"].append({"pluginRef": SCORER, "weight": 1})
    gw = await start_gateway(config(pods, kv, doc))
    plugins = gw.gateway.plugins.plugins
    producer, scorer = plugins[PRODUCER], plugins[SCORER]
    assert isinstance(producer, PrecisePrefixCacheProducer)
    assert isinstance(scorer, PrecisePrefixCacheScorer)
    seen: list[tuple[PrefixCacheMatchInfo | None, PrefixCacheMatchInfo | None]] = []
    original = scorer.produce

    async def spy(state: Any, request: Any, endpoints: Any) -> None:
        await original(state, request, endpoints)  # runs after the producer (declared later)
        seen.append((prefix_match_reader(PRODUCER)(state),
                     prefix_match_reader(SCORER)(state)))  # fmt: skip

    scorer.produce = spy  # type: ignore[method-assign]
    for plugin in (producer, scorer):
        ingest = plugin.ingest
        assert ingest is not None
        await eventually(lambda i=ingest: len(i.subscriber.subscriptions()) == 3)
    warmed = list(range(7000, 7000 + 16 * 6))  # 6 blocks
    half = warmed[: 16 * 3] + list(range(100, 100 + 16 * 3))  # its first 3 blocks, then new
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim-model", "prompt": warmed, "max_tokens": 1}
        await warm(http, pods[1], body,
                   lambda: producer.stats.stored_blocks >= 6 and scorer.stats.stored_blocks >= 6)  # fmt: skip
        for prompt in (warmed, half, list(range(1, 97))):
            assert await served_by(http, gw, prompt) == (
                pods[0].name if prompt[0] == 1 else pods[1].name
            )
    matches = [
        (p.matched_blocks, p.total_blocks, s.matched_blocks, s.total_blocks)
        for p, s in seen
        if p is not None and s is not None
    ]
    assert matches == [
        ({pods[1].name: 6.0}, 6, {pods[1].name: 6.0}, 6),
        ({pods[1].name: 3.0}, 6, {pods[1].name: 3.0}, 6),
        ({}, 6, {}, 6),
    ]
