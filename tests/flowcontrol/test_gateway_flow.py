"""Flow control through the gateway, on simulated pods: requests beyond the pool's room wait
in the gateway and go as room returns; sheddable ones are refused with a 429; config errors
stop the gateway before it binds."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import pytest

from heimdall_proxy.config.gateway import ConfigError
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.server.gateway import Gateway
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config

FLOW: dict[str, Any] = {
    "featureGates": ["flowControl"],
    "plugins": [
        {"type": "concurrency-detector", "name": "one-each", "parameters": {"maxConcurrency": 1}},
        {"type": "queue-scorer"},
        {"type": "active-request-scorer"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "active-request-scorer"}],
        }
    ],
    "flowControl": {"saturationDetector": {"pluginRef": "one-each"}},
    "objectives": [{"name": "batch", "priority": -1}],
}
BODY = {"model": "sim-model", "prompt": "hello", "max_tokens": 4, "stream": True}


async def test_requests_beyond_room_wait_in_the_gateway_then_all_succeed(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(2)]
    hold = asyncio.Event()
    for p in pods:
        p.pod.hold = hold
    gw = await start_gateway(make_config(pods, FLOW))
    async with aiohttp.ClientSession() as http:
        first = []
        for _ in range(2):
            r = await http.post(f"{gw.url}/v1/completions", json=BODY)
            await r.content.readuntil(b"\n\n")  # in flight on its pod
            first.append(r)
        assert {r.headers["x-sim-pod"] for r in first} == {p.name for p in pods}
        queued = [asyncio.create_task(http.post(f"{gw.url}/v1/completions", json=BODY))]
        queued.append(asyncio.create_task(http.post(f"{gw.url}/v1/completions", json=BODY)))
        await eventually(lambda: gw.gateway.flow.queued == 2)
        async with http.post(
            f"{gw.url}/v1/completions",
            json=BODY,
            headers={"x-gateway-inference-objective": "batch"},
        ) as shed:
            assert shed.status == 429
            assert shed.headers["Retry-After"] == "1"
            err = (await shed.json())["error"]
            assert err["code"] == "pool_saturated" and "sheddable" in err["message"]
        hold.set()
        served: Counter[str] = Counter()
        for r in first:
            await r.read()
            served[r.headers["x-sim-pod"]] += 1
            r.release()
        for t in queued:
            r = await t
            assert r.status == 200
            await r.read()
            served[r.headers["x-sim-pod"]] += 1
            r.release()
    assert sum(served.values()) == 4
    labels = {"fairness_id": "default-flow", "priority": "0", "inference_pool": "heimdall"}
    dispatched = gw.metric(
        "inference_extension_flow_control_request_queue_duration_seconds_count",
        {**labels, "outcome": "Dispatched"},
    )
    assert dispatched == 2
    assert gw.metric("inference_extension_flow_control_queue_size", labels) == 0
    shed_count = gw.metric(
        "inference_extension_flow_control_rejections_total",
        {"priority": "-1", "reason": "shed", "inference_pool": "heimdall"},
    )
    assert shed_count == 1
    await eventually(lambda: gw.gateway.load.requests == {} and gw.gateway.load.pending == 0)


async def test_a_queued_client_that_hangs_up_leaves_no_trace(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod()]
    hold = asyncio.Event()
    pods[0].pod.hold = hold
    gw = await start_gateway(make_config(pods, FLOW))
    async with aiohttp.ClientSession() as http:
        r = await http.post(f"{gw.url}/v1/completions", json=BODY)
        await r.content.readuntil(b"\n\n")
        waiting = asyncio.create_task(http.post(f"{gw.url}/v1/completions", json=BODY))
        await eventually(lambda: gw.gateway.flow.queued == 1)
        waiting.cancel()
        await eventually(lambda: gw.gateway.flow.queued == 0)
        hold.set()
        await r.read()
        r.release()
    await eventually(lambda: gw.gateway.load.requests == {} and gw.gateway.load.pending == 0)
    assert gw.running() == 0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"saturationDetector": {"pluginRef": "nope"}}, "names no declared plugin"),
        ({"saturationDetector": {"pluginRef": "queue-scorer"}}, "is not a SaturationDetector"),
        ({"saturationDetector": {"queueDepthThreshold": 0}}, "queueDepthThreshold"),
        (
            {"flowControl": {"priorityBands": [{"priority": 1, "fairnessPolicyRef": "x"}]}},
            "names no declared plugin",
        ),
    ],
)
def test_flow_config_errors_name_the_field(section: dict[str, Any], message: str) -> None:
    doc = {"featureGates": ["flowControl"], "plugins": [{"type": "queue-scorer"}], **section}
    with pytest.raises(ConfigError, match=message):
        Gateway(make_config([], doc), ServerOptions(), load_builtin_plugins())


def test_old_gie_detector_section_configures_the_utilization_detector() -> None:
    doc = {"saturationDetector": {"queueDepthThreshold": 2, "kvCacheUtilThreshold": 0.5}}
    gw = Gateway(make_config([], doc), ServerOptions(), load_builtin_plugins())
    params = gw.flow.detector.params  # type: ignore[attr-defined]
    assert params.queue_depth_threshold == 2 and params.kv_cache_util_threshold == 0.5
    assert not gw.flow.queues and not gw.flow.judge  # no gate, nothing sheddable
