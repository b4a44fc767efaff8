"""One in-flight ledger per gateway: every plugin that weighs the load in flight reads the
gateway's, and none keeps a count of its own that could drift from it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from heimdall_proxy.framework.inflight import InFlightLoad
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
