"""The refresher against real simulated pods: quiet pods are scraped less often than busy ones,
a request through the gateway brings a quiet pod back to the busy cadence, and only the
families the plugins need are read."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from heimdall_proxy.datalayer.vllm_metrics import CACHE_CONFIG, CORE_FAMILIES, LORA_INFO
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.mark.slow
async def test_quiet_pods_are_scraped_less_often(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    quiet, busy = await start_pod(), await start_pod()
    busy.pod.metrics_override = {"running": 2}
    gw = await start_gateway(
        make_config([quiet, busy]), metrics_interval=0.02, idle_metrics_interval=0.32
    )
    refresher = gw.gateway.refresher
    assert refresher is not None
    await eventually(lambda: refresher.scrapes.get(busy.name, 0) >= 60)
    # Back-off 0.04, 0.08, 0.16, then 0.32: a handful of scrapes while the busy pod had 60.
    assert refresher.scrapes.get(quiet.name, 0) <= 12
    assert refresher.cadence.pod(quiet.name).quiet
    assert not refresher.cadence.pod(busy.name).quiet
    # Vouched for by the ledger, the quiet pod's numbers are never older than a few ticks.
    assert gw.gateway.pool.get(quiet.name).metrics.age() < 0.1  # type: ignore[union-attr]


@pytest.mark.slow
async def test_a_pods_engine_seen_full_gives_the_ledger_its_slots(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    full, free = await start_pod(), await start_pod()
    full.pod.metrics_override = {"running": 3, "waiting": 2}
    # running more than full's count, nothing waiting: not taken to be alike
    free.pod.metrics_override = {"running": 4}
    gw = await start_gateway(make_config([full, free]), metrics_interval=0.02)
    refresher = gw.gateway.refresher
    assert refresher is not None
    ledger = refresher.cadence.load
    await eventually(lambda: ledger.slots_seen(full.name) == 3)
    await eventually(lambda: refresher.scrapes.get(free.name, 0) >= 3)
    assert ledger.slots_seen(free.name) is None


@pytest.mark.slow
async def test_a_request_wakes_a_quiet_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]), metrics_interval=0.02, idle_metrics_interval=5.0)
    refresher = gw.gateway.refresher
    assert refresher is not None
    state = refresher.cadence.pod(pod.name)
    await eventually(lambda: state.quiet and state.interval >= 0.64)
    # A change the gateway did not cause is not seen while the pod backs off...
    pod.pod.metrics_override = {"waiting": 4}
    await asyncio.sleep(0.1)
    endpoint = gw.gateway.pool.get(pod.name)
    assert endpoint is not None
    assert endpoint.metrics.waiting == 0
    # ...but a request sent through the gateway makes the pod due on the next tick.
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
    await eventually(lambda: endpoint.metrics.waiting == 4, within=0.5)
    assert state.interval == 0.02


@pytest.mark.slow
async def test_the_loop_sleeps_while_every_pod_is_quiet_and_a_send_wakes_it(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(3)]
    gw = await start_gateway(
        make_config(pods), metrics_interval=0.02, idle_metrics_interval=2.0, models_interval=5.0
    )
    refresher = gw.gateway.refresher
    assert refresher is not None
    states = [refresher.cadence.pod(p.name) for p in pods]
    await eventually(lambda: all(s.quiet and s.interval == 2.0 for s in states), within=10.0)
    # Every pod quiet: a pass at each grid step (0.5 s) at most, not one every 5 ms.
    passes = refresher.passes
    await asyncio.sleep(1.0)
    assert refresher.passes - passes <= 3
    pool = gw.gateway.pool
    assert all(e.metrics.held for e in pool.endpoints())
    # Asleep with nothing due for a while: only the send can make a scrape happen now.
    await eventually(lambda: refresher._wake_at - time.monotonic() > 0.3)
    planned, scraped = refresher._wake_at, dict(refresher.scrapes)
    for p in pods:  # what only a scrape can show
        p.pod.metrics_override = {"waiting": 3}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
    (sent,) = gw.gateway.load.sent  # the pod the request went to
    endpoint = pool.get(sent)
    assert endpoint is not None
    await eventually(lambda: endpoint.metrics.waiting == 3, within=0.25)
    assert time.monotonic() < planned and refresher.scrapes[sent] > scraped[sent]
    assert not endpoint.metrics.held and not refresher.cadence.is_quiet(sent)
    others = [e for e in pool.endpoints() if e is not endpoint]
    assert all(e.metrics.held and e.metrics.waiting == 0 for e in others)  # asleep still
    assert all(refresher.scrapes[e.name] == scraped[e.name] for e in others)


async def test_the_families_read_are_the_plugins_union(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    plain = await start_gateway(make_config([pod]))
    assert plain.gateway.refresher is not None
    assert plain.gateway.refresher.options.families == CORE_FAMILIES
    epp = {
        "plugins": [{"type": "lora-affinity-scorer"}, {"type": "prefix-cache-scorer"}],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "lora-affinity-scorer"},
                    {"pluginRef": "prefix-cache-scorer"},
                ],
            }
        ],
    }
    both = await start_gateway(make_config([pod], epp))
    assert both.gateway.refresher is not None
    assert both.gateway.refresher.options.families == CORE_FAMILIES | {LORA_INFO, CACHE_CONFIG}
    endpoint = both.gateway.pool.get(pod.name)
    assert endpoint is not None
    await eventually(lambda: endpoint.metrics.block_size is not None)
