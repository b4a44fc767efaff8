"""One in-flight ledger per gateway: every plugin that weighs the load in flight reads the
gateway's, and none keeps a count of its own that could drift from it. Likewise for what is
learned from the gateway's data: the queue price (the ledger's) and the prefix popularity
(the gateway's), read by any plugin, kept by none."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.popularity import PrefixPopularity, SharedPopularity
from heimdall_proxy.framework.queue_delay import QueueDelay
from heimdall_proxy.framework.queue_price import QueuePrice
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config

#: Every built-in plugin that weighs requests in flight.
READERS = [
    "inflight-load-producer",
    "token-load-scorer",
    "active-request-scorer",
    "outstanding-work-scorer",
    "prefix-cache-scorer",
    "prefix-cache-affinity-filter",
    "predicted-latency-producer",
    "concurrency-detector",
]
EPP: dict[str, Any] = {
    "plugins": [{"type": t} for t in READERS] + [{"type": "max-score-picker"}],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "prefix-cache-affinity-filter"},
                {"pluginRef": "token-load-scorer"},
                {"pluginRef": "active-request-scorer"},
                {"pluginRef": "outstanding-work-scorer"},
                {"pluginRef": "prefix-cache-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}


def own_ledgers(plugin: object, gateway_load: InFlightLoad) -> list[str]:
    """Attributes of `plugin` holding an in-flight ledger other than the gateway's."""
    names = getattr(type(plugin), "__slots__", ()) or vars(plugin)
    found = []
    for name in names:
        value = getattr(plugin, name, None)
        if isinstance(value, InFlightLoad) and value is not gateway_load:
            found.append(name)
    return found


async def test_every_load_reader_reads_the_gateways_one_ledger(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(), await start_pod()]
    hold = asyncio.Event()
    for p in pods:
        p.pod.hold = hold
    gw = await start_gateway(make_config(pods, EPP))
    load = gw.gateway.load
    plugins = gw.gateway.plugins.plugins
    assert {p.type for p in plugins.values()} >= set(READERS)  # type: ignore[attr-defined]
    for name, plugin in plugins.items():
        assert own_ledgers(plugin, load) == [], name
        assert getattr(plugin, "load", load) is load, name
    body = {"model": "sim-model", "prompt": "word " * 300, "max_tokens": 40, "stream": True}
    async with aiohttp.ClientSession() as http:
        r = await http.post(f"{gw.url}/v1/completions", json=body)
        await r.content.readuntil(b"\n\n")
        pod = r.headers["x-sim-pod"]
        assert load.requests == {pod: 1} and load.prompts[pod] > 0
        work = plugins["outstanding-work-scorer"]
        assert work.work(pod) > 0  # type: ignore[attr-defined]
        hold.set()
        await r.read()
        r.release()
    await eventually(lambda: load.requests == {} and load.prompts == {} and load.tokens == {})
    assert work.work(pod) == 0  # type: ignore[attr-defined]
    assert plugins["active-request-scorer"].count(pod) == 0  # type: ignore[attr-defined]


#: What is learned from the gateway's data; only its owners hold one.
LEARNED = (QueuePrice, QueueDelay, PrefixPopularity, SharedPopularity)


def learned_state(plugin: object) -> list[tuple[str, object]]:
    """(attribute, value) of `plugin` holding learned costs, one level of containers deep."""
    names = getattr(type(plugin), "__slots__", ()) or vars(plugin)
    found = []
    for name in names:
        value = getattr(plugin, name, None)
        inner = value.values() if isinstance(value, dict) else (
            value if isinstance(value, list | tuple | set) else [value]
        )  # fmt: skip
        found += [(name, v) for v in inner if isinstance(v, LEARNED)]
    return found


LEARNING_EPP: dict[str, Any] = {
    "plugins": [
        {"type": "prefix-cache-scorer"},
        {"type": "prefix-cache-affinity-filter", "parameters": {"sharedPrefixDiscount": 0.75}},
        {"type": "prefix-cache-affinity-filter", "name": "strict",
         "parameters": {"affinityThreshold": 0.99, "sharedPrefixDiscount": 0.75}},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "prefix-cache-affinity-filter"},
                {"pluginRef": "strict"},
                {"pluginRef": "prefix-cache-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}  # fmt: skip


async def test_learned_costs_are_the_owners_and_outlive_a_reload(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """Two affinity filters read one queue price (the ledger's, fed by the relay at each
    stream's first chunk) and one prefix popularity (the gateway's, one count per request
    whichever filters priced it); a reload's filters read the same objects."""
    pods = [await start_pod(), await start_pod()]
    gw = await start_gateway(make_config(pods, LEARNING_EPP))
    load = gw.gateway.load
    popularity = gw.gateway.routing.popularity

    def check_owned() -> None:
        prices, counts = load.queue_prices(), popularity.all()
        assert len(prices) == 1 and len(counts) == 1
        for name, plugin in gw.gateway.plugins.plugins.items():
            for attr, value in learned_state(plugin):
                assert any(value is owned for owned in (*prices, *counts)), (name, attr)

    check_owned()
    body = {"model": "sim-model", "prompt": "shared words " * 200, "stream": True}
    async with aiohttp.ClientSession() as http:
        for i in range(3):
            r = await http.post(f"{gw.url}/v1/completions", json={**body, "max_tokens": 2 + i})
            assert r.status == 200
            await r.read()
    (price,) = load.queue_prices()
    (counted,) = popularity.all()
    await eventually(lambda: load.requests == {})
    assert not price.waiting  # every attempt was fed and forgotten by the ledger
    assert price.last is not None  # the first chunks were sampled
    # the two filters priced the same prefix, each request counted once: the second and third
    # shared the first's prefix
    keys = list(counted.popularity._counts)
    assert counted.popularity._seen == 3  # three requests, whichever filters priced them
    assert len(keys) == 1 and counted.count(keys[0]) == pytest.approx(1.0 + 0.5 ** (1 / 64))

    await gw.gateway.reload(make_config(pods, LEARNING_EPP))
    assert load.queue_prices() == [price] and popularity.all() == [counted]
    assert gw.gateway.routing.popularity is popularity
    check_owned()
