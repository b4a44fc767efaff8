"""Two gateway apps in one process sharing their routing state through the real Redis
(127.0.0.1:6379), with simulated pods behind them: what one replica routes, the other sees."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import ApproxPrefixCacheProducer
from heimdall_proxy.plugins.scheduling.scorers.active_request import ActiveRequestScorer
from heimdall_proxy.plugins.scheduling.scorers.no_hit_lru import NoHitLRUScorer
from tests.conftest import GatewayFactory, PodFactory, RunningGateway, eventually, make_config
from tests.kvcache.redisns import REDIS_URL, redis_namespace
from tests.server.test_prefix_routing import long_prompt, send


def shared_epp(prefix: str) -> dict[str, Any]:
    shared = {"redisConfig": {"address": REDIS_URL, "keyPrefix": prefix}, "syncInterval": "10ms"}
    return {
        "plugins": [
            {"type": "prefix-cache-scorer", "parameters": shared},
            {"type": "no-hit-lru-scorer", "parameters": shared},
            {"type": "active-request-scorer", "parameters": shared},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "prefix-cache-scorer", "weight": 3},
                    {"pluginRef": "no-hit-lru-scorer", "weight": 2},
                    {"pluginRef": "active-request-scorer", "weight": 1},
                ],
            }
        ],
    }


@pytest.fixture
async def ns() -> AsyncIterator[str]:
    async with redis_namespace() as prefix:
        yield prefix


def shared_view(gw: RunningGateway) -> tuple[list[str], dict[str, int]]:
    """What one replica knows of the routing so far: the no-hit LRU's order and how many
    prefix blocks it holds per pod."""
    lru = gw.gateway.plugins.plugins["no-hit-lru-scorer"]
    prefix = gw.gateway.plugins.plugins["approx-prefix-cache-producer"]
    assert isinstance(lru, NoHitLRUScorer) and isinstance(prefix, ApproxPrefixCacheProducer)
    return lru.last_used(), {pod: prefix.index.size(pod) for pod in lru.last_used()}


async def settle(a: RunningGateway, b: RunningGateway) -> None:
    """Until both replicas know the same routing: a change reaches the other in about two
    sync intervals; waiting for it rather than for a fixed time keeps a loaded machine from
    failing the test and an idle one from waiting longer than it must."""
    await eventually(lambda: shared_view(a) == shared_view(b), within=5.0)


@pytest.mark.slow
async def test_a_prompt_routed_by_one_replica_returns_to_its_pod_through_the_other(
    start_pod: PodFactory, start_gateway: GatewayFactory, ns: str
) -> None:
    pods = [await start_pod() for _ in range(3)]
    a = await start_gateway(make_config(pods, shared_epp(ns)))
    b = await start_gateway(make_config(pods, shared_epp(ns)))
    async with aiohttp.ClientSession() as http:
        # Cold prompts alternate between the replicas and still rotate over every pod: the
        # no-hit LRU is one, not two.
        first = []
        for i in range(6):
            first.append(await send(http, (a, b)[i % 2], {"prompt": long_prompt(f"t{i}")}))
            await settle(a, b)
        assert sorted(first[:3]) == sorted(p.name for p in pods)
        assert first[3:] == first[:3]
        # A prompt sent through one replica goes back to its pod through the other.
        for i in range(6):
            other = (b, a)[i % 2]
            again = await send(http, other, {"prompt": long_prompt(f"t{i}") + " more"})
            assert again == first[i]


@pytest.mark.slow
async def test_requests_in_flight_through_one_replica_count_on_the_other(
    start_pod: PodFactory, start_gateway: GatewayFactory, ns: str
) -> None:
    pods = [await start_pod(time_scale=1.0) for _ in range(2)]
    a = await start_gateway(make_config(pods, shared_epp(ns)))
    b = await start_gateway(make_config(pods, shared_epp(ns)))

    def counter(gw: RunningGateway) -> ActiveRequestScorer:
        plugin = gw.gateway.plugins.plugins["active-request-scorer"]
        assert isinstance(plugin, ActiveRequestScorer)
        return plugin

    body = {"model": "sim-model", "prompt": "hello " * 50, "max_tokens": 400, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{a.url}/v1/completions", json=body) as r:
            assert r.status == 200
            pod = r.headers["x-sim-pod"]
            await r.content.readline()
            # held open through replica a: replica b counts it
            await eventually(lambda: counter(b).count(pod) == 1, within=2.0)
            assert counter(a).count(pod) == 1
            await r.read()
        await eventually(lambda: counter(b).count(pod) == 0, within=2.0)
