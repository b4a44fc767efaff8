"""approx-prefix-cache-producer in whole configs: llm-d's shapes pass check-config, the
producer + scorer + affinity filter shape serves through the gateway, and named producers
keep one index each, read by the scorers that name them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from heimdall_proxy.cli.main import main
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.prefix_affinity.filter import PrefixCacheAffinityFilter
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import ApproxPrefixCacheProducer
from heimdall_proxy.plugins.scheduling.scorers.prefix_cache import PrefixCacheScorer
from tests.config.test_build import ENDPOINTS, build
from tests.conftest import GatewayFactory, PodFactory, make_config
from tests.helpers import ep
from tests.plugins.helpers import ctx, req

CONFIGS = sorted((Path(__file__).parent / "configs").glob("llmd-*.yaml"))
LONG = "The quick brown fox jumps over the lazy dog. " * 40  # 1,800 chars


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_llm_d_configs_pass_check_config(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(path)]) == 0
    assert "approx-prefix-cache-producer" in capsys.readouterr().out


def test_llm_d_configs_get_one_producer_read_by_the_scorer() -> None:
    for path in CONFIGS:
        import yaml

        doc: dict[str, Any] = yaml.safe_load(path.read_text())
        _, pset = build(doc)
        producers = [p for p in pset.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)]
        assert [p.name for p in producers] == ["approx-prefix-cache-producer"], path.name
        assert producers[0].params.max_prefix_tokens_to_match == 16384
        scorer = pset.plugins["prefix-cache-scorer"]
        assert isinstance(scorer, PrefixCacheScorer)
        assert scorer.params.prefix_match_info_producer_name == "approx-prefix-cache-producer"


TWO_PRODUCERS: dict[str, Any] = {
    "plugins": [
        {"name": "gpu", "type": "approx-prefix-cache-producer",
         "parameters": {"autoTune": False, "blockSizeTokens": 16}},
        {"name": "cpu", "type": "approx-prefix-cache-producer",
         "parameters": {"autoTune": False, "blockSizeTokens": 64}},
        {"name": "gpu-scorer", "type": "prefix-cache-scorer",
         "parameters": {"prefixMatchInfoProducerName": "gpu"}},
        {"name": "cpu-scorer", "type": "prefix-cache-scorer",
         "parameters": {"prefixMatchInfoProducerName": "cpu"}},
        {"type": "max-score-picker"},
    ],
    "endpoints": ENDPOINTS,
}  # fmt: skip


async def test_two_named_producers_each_read_by_its_own_scorer() -> None:
    _, pset = build(TWO_PRODUCERS)
    producers = [p for p in pset.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)]
    assert sorted(p.name for p in producers) == ["cpu", "gpu"]  # none made beside them
    a, b = ep("a"), ep("b")
    sent = ctx(req("completions", {"prompt": LONG}), a)
    for producer in pset.producers:
        await producer.produce(sent.state, sent.request, [a, b])
    for hook in pset.pre_request:
        await hook.pre_request(sent)
    # 1,800 of 2,000 characters: 28 of 31 blocks of 64 characters, but all 7 of 256
    state = CycleState()
    again = req("completions", {"prompt": LONG + "x" * 200})
    for producer in pset.producers:
        await producer.produce(state, again, [a, b])
    gpu = pset.plugins["gpu-scorer"].score(state, again, [a, b])  # type: ignore[attr-defined]
    cpu = pset.plugins["cpu-scorer"].score(state, again, [a, b])  # type: ignore[attr-defined]
    assert (gpu["a"], gpu["b"]) == (pytest.approx(28 / 31), 0.0)
    assert (cpu["a"], cpu["b"]) == (1.0, 0.0)


PRODUCER_SCORER_FILTER: dict[str, Any] = {
    "plugins": [
        {"name": "idx", "type": "approx-prefix-cache-producer",
         "parameters": {"maxPrefixTokensToMatch": 16384}},
        {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": "idx"}},
        {"type": "prefix-cache-affinity-filter",
         "parameters": {"prefixPluginType": "approx-prefix-cache-producer",
                        "prefixPluginName": "idx"}},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {"name": "default", "plugins": [
            {"pluginRef": "prefix-cache-affinity-filter"},
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "queue-scorer", "weight": 1},
            {"pluginRef": "max-score-picker"},
        ]},
    ],
}  # fmt: skip


async def test_producer_scorer_and_affinity_filter_serve_through_the_gateway(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(3)]
    gw = await start_gateway(make_config(pods, PRODUCER_SCORER_FILTER))
    plugins = gw.gateway.plugins.plugins
    producers = [p for p in plugins.values() if isinstance(p, ApproxPrefixCacheProducer)]
    assert [p.name for p in producers] == ["idx"]  # the declared one, no default beside it
    assert isinstance(plugins["prefix-cache-affinity-filter"], PrefixCacheAffinityFilter)
    served = []
    async with aiohttp.ClientSession() as http:
        for i in range(5):
            body = {"model": "sim-model", "max_tokens": 1, "prompt": f"{LONG} question {i}"}
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
                served.append(r.headers["x-sim-pod"])
    assert len(set(served)) == 1
    (index,) = producers
    assert index.index.size(served[0]) > 0
    assert all(index.index.size(p.name) == 0 for p in pods if p.name != served[0])
