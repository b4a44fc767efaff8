"""approx-prefix-cache-producer owns the approximate index; prefix-cache-scorer and the other
readers read its match; the seeds' shape (index parameters on the scorer) keeps its own."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import pytest

from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_reader
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import (
    ApproxPrefixCacheProducer,
    ApproxPrefixProducerParams,
)
from heimdall_proxy.plugins.scheduling.scorers.no_hit_lru import NoHitLRUScorer
from heimdall_proxy.plugins.scheduling.scorers.prefix_cache import (
    PrefixCacheParams,
    PrefixCacheScorer,
)
from tests.config.test_build import ENDPOINTS, build
from tests.conftest import GatewayFactory, PodFactory, make_config
from tests.helpers import ep
from tests.plugins.helpers import ctx, req

PRODUCER = "approx-prefix-cache-producer"
LONG = "The quick brown fox jumps over the lazy dog. " * 40  # 1,800 chars


def producer(name: str = PRODUCER, **params: object) -> ApproxPrefixCacheProducer:
    p = ApproxPrefixProducerParams.model_validate({"autoTune": False, **params})
    return ApproxPrefixCacheProducer(name, p, None)  # type: ignore[arg-type]


def reader(producer_name: str, **params: object) -> PrefixCacheScorer:
    p = PrefixCacheParams.model_validate({"prefixMatchInfoProducerName": producer_name, **params})
    return PrefixCacheScorer("prefix-cache-scorer", p, None)  # type: ignore[arg-type]


async def route(
    plugin: ApproxPrefixCacheProducer, request: InferenceRequest, pod: Endpoint
) -> None:
    c = ctx(request, pod)
    await plugin.produce(c.state, c.request, [pod])
    await plugin.pre_request(c)


def test_llm_d_defaults() -> None:
    p = ApproxPrefixProducerParams()
    assert (p.auto_tune, p.block_size_tokens, p.lru_capacity_per_server) == (True, 16, 31250)
    assert (p.max_prefix_blocks_to_match, p.max_prefix_tokens_to_match) == (2048, 131072)
    assert p.max_blocks(16) == 8192  # the token cap wins when set
    assert ApproxPrefixProducerParams(maxPrefixTokensToMatch=0).max_blocks(16) == 2048
    assert (
        ApproxPrefixProducerParams(maxPrefixTokensToMatch=0, maxPrefixBlocksToMatch=0).max_blocks(
            16
        )
        is None
    )  # both 0: the whole prompt


async def test_the_scorer_reads_the_producers_match() -> None:
    owner = producer()
    scorer = reader(PRODUCER)
    a, b = ep("a"), ep("b")
    await route(owner, req("completions", {"prompt": LONG}), a)
    state = CycleState()
    request = req("completions", {"prompt": LONG})
    await owner.produce(state, request, [a, b])
    info = prefix_match_reader(PRODUCER)(state)
    assert isinstance(info, PrefixCacheMatchInfo) and info.total_blocks == len(LONG) // 64
    assert scorer.score(state, request, [a, b]) == {"a": 1.0, "b": 0.0}
    # no match published (the producer did not run): 0 everywhere, nothing kept
    assert scorer.score(CycleState(), request, [a, b]) == {"a": 0.0, "b": 0.0}
    assert not hasattr(scorer, "index")


async def test_match_length_weight_favours_long_cached_prefixes() -> None:
    owner = producer()
    a, b = ep("a"), ep("b")
    short = LONG[: 64 * 4]
    await route(owner, req("completions", {"prompt": LONG}), a)
    await route(owner, req("completions", {"prompt": short}), b)
    state = CycleState()
    request = req("completions", {"prompt": LONG})
    await owner.produce(state, request, [a, b])
    total = len(LONG) // 64
    plain = reader(PRODUCER).score(state, request, [a, b])
    assert plain == {"a": 1.0, "b": pytest.approx(4 / total)}
    weighted = reader(PRODUCER, matchLengthWeight=0.5, matchLengthScaleTokens=512)
    scores = weighted.score(state, request, [a, b])
    # a: 28 blocks x 16 = 448 tokens of 512 -> 0.5 x (448/512)^2 + 0.5 x 1
    assert scores["a"] == pytest.approx(0.5 * (448 / 512) ** 2 + 0.5)
    assert scores["b"] == pytest.approx(0.5 * (64 / 512) ** 2 + 0.5 * 4 / total)


async def test_two_producers_keep_two_indexes() -> None:
    gpu, cpu = producer("gpu", blockSizeTokens=16), producer("cpu", blockSizeTokens=64)
    a = ep("a")
    request = req("completions", {"prompt": LONG})
    for owner in (gpu, cpu):
        await route(owner, request, a)
    state = CycleState()
    for owner in (gpu, cpu):
        await owner.produce(state, request, [a])
    g = prefix_match_reader("gpu")(state)
    c = prefix_match_reader("cpu")(state)
    assert g is not None and c is not None
    assert (g.block_size, c.block_size) == (16, 64)
    assert g.total_blocks == 4 * c.total_blocks
    assert gpu.index is not cpu.index


LLM_D_SHAPE: dict[str, Any] = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [
        {
            "type": PRODUCER,
            "parameters": {"maxPrefixTokensToMatch": 16384, "lruCapacityPerServer": 31250},
        },
        {"type": "prefix-cache-scorer"},
        {"type": "no-hit-lru-scorer", "parameters": {"lruSize": 2048}},
        {"type": "decode-filter"},
        {"type": "max-score-picker"},
        {"type": "single-profile-handler"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "decode-filter"},
                {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "no-hit-lru-scorer", "weight": 1},
            ],
        }
    ],
    "endpoints": ENDPOINTS,
}


def test_a_config_with_a_producer_links_its_readers() -> None:
    _, pset = build(LLM_D_SHAPE)
    plugins = pset.plugins
    assert isinstance(plugins[PRODUCER], ApproxPrefixCacheProducer)
    scorer = plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrefixCacheScorer)  # one index: the producer's
    assert scorer.params.prefix_match_info_producer_name == PRODUCER
    lru = plugins["no-hit-lru-scorer"]
    assert isinstance(lru, NoHitLRUScorer)
    assert (lru.params.prefix_plugin_type, lru.params.prefix_plugin_name) == (PRODUCER, PRODUCER)
    assert plugins[PRODUCER] in pset.producers and scorer not in pset.producers


def test_the_seeds_shape_gets_a_producer_made_with_the_scorers_parameters() -> None:
    seed = {
        "plugins": [
            {"type": "prefix-cache-scorer", "parameters": {"blockSizeTokens": 32}},
            {"type": "no-hit-lru-scorer"},
            {"type": "max-score-picker"},
        ],
        "endpoints": ENDPOINTS,
    }
    _, pset = build(seed)
    made = pset.plugins[PRODUCER]
    assert isinstance(made, ApproxPrefixCacheProducer) and made in pset.producers
    # the seeds' defaults for the scorer's index, not llm-d's for the producer
    assert (made.params.block_size_tokens, made.params.max_prefix_blocks_to_match) == (32, 256)
    assert made.params.max_prefix_tokens_to_match == 0
    scorer = pset.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrefixCacheScorer) and scorer not in pset.producers
    assert scorer.params.prefix_match_info_producer_name == PRODUCER
    assert "blockSizeTokens" not in (scorer.params.model_extra or {})
    lru = pset.plugins["no-hit-lru-scorer"]
    assert (lru.params.prefix_plugin_type, lru.params.prefix_plugin_name) == (PRODUCER, PRODUCER)  # type: ignore[attr-defined]
    # beside a declared producer, the seed scorer still gets its own (another name), and the
    # readers that named the scorer read it
    both = {**seed, "plugins": [{"type": PRODUCER}, *seed["plugins"]]}
    _, pset = build(both)
    own = f"{PRODUCER}-2"
    assert pset.plugins["prefix-cache-scorer"].params.prefix_match_info_producer_name == own  # type: ignore[attr-defined]
    assert pset.plugins[own].params.block_size_tokens == 32  # type: ignore[attr-defined]
    lru = pset.plugins["no-hit-lru-scorer"]
    assert lru.params.prefix_plugin_name == own  # type: ignore[attr-defined]


def test_a_consumer_without_a_producer_gets_the_default_one() -> None:
    for consumer in ("no-hit-lru-scorer", "prefix-cache-affinity-filter"):
        doc = {
            "plugins": [{"type": consumer}, {"type": "max-score-picker"}],
            "endpoints": ENDPOINTS,
        }
        _, pset = build(doc)
        made = pset.plugins[PRODUCER]
        assert isinstance(made, ApproxPrefixCacheProducer)
        assert made.params.max_prefix_tokens_to_match == 131072  # llm-d's defaults
    # no producer is made where nothing reads a match
    _, pset = build({"plugins": [{"type": "queue-scorer"}], "endpoints": ENDPOINTS})
    assert PRODUCER not in pset.plugins


def test_two_scorers_reading_one_producer_share_its_index() -> None:
    doc = {
        "plugins": [
            {"name": "a", "type": "prefix-cache-scorer"},
            {"name": "b", "type": "prefix-cache-scorer", "parameters": {"matchLengthWeight": 0.5}},
            {"type": "max-score-picker"},
        ],
        "endpoints": ENDPOINTS,
    }
    _, pset = build(doc)
    producers = [p for p in pset.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)]
    assert len(producers) == 1
    for name in ("a", "b"):
        assert pset.plugins[name].params.prefix_match_info_producer_name == PRODUCER  # type: ignore[attr-defined]


async def test_the_llm_d_shape_routes_a_repeated_prefix_to_its_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(), await start_pod(), await start_pod()]
    doc = {k: v for k, v in LLM_D_SHAPE.items() if k not in ("endpoints",)}
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] != "decode-filter"]
    doc["schedulingProfiles"] = [
        {
            "name": "default",
            "plugins": [p for p in LLM_D_SHAPE["schedulingProfiles"][0]["plugins"]
                        if p["pluginRef"] != "decode-filter"],
        }
    ]  # fmt: skip
    gw = await start_gateway(make_config(pods, doc))
    body = {"model": "sim-model", "prompt": LONG, "max_tokens": 1}
    served = []
    async with aiohttp.ClientSession() as http:
        for i in range(4):
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
                served.append(r.headers["x-sim-pod"])
            # a cold prompt between: no-hit-lru sends it elsewhere, the prefix stays put
            cold = {**body, "prompt": f"{i} " + "another prompt entirely " * 30}
            async with http.post(f"{gw.url}/v1/completions", json=cold) as r:
                assert r.status == 200
    assert len(set(served)) == 1


def test_the_block_size_kept_for_the_candidates_follows_a_pod_reporting_another() -> None:
    """Read once per candidate list, the block size still changes as soon as one pod's
    scrape reports another (Endpoint.block_size_generation), and a scrape that reports the
    same size keeps it."""
    p = producer(autoTune=True)
    pods = [ep(f"p{i}", block_size=16) for i in range(9)]
    assert p._block_size(pods) == 16
    generation = Endpoint.block_size_generation
    pods[0].metrics = dataclasses.replace(pods[0].metrics, waiting=3)  # same block size
    assert Endpoint.block_size_generation == generation
    assert p._block_size(pods) == 16
    for e in pods[:5]:
        e.metrics = dataclasses.replace(e.metrics, block_size=64)
    assert Endpoint.block_size_generation > generation
    assert p._block_size(pods) == 64  # the most common size now
    assert p._block_size(pods[5:]) == 16  # another candidate list, read afresh
