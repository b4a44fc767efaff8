"""--debug-routes: the scheduling decision for a body, with every filter and score, and
nothing forwarded."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayFactory, PodFactory, make_config

EPP = {
    "plugins": [
        {"type": "by-label", "parameters": {"label": "tier", "validValues": ["a"]}},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "by-label"},
                {"pluginRef": "queue-scorer", "weight": 2},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def post(url: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_debug_route_explains_the_pick_and_forwards_nothing(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    a1 = await start_pod({"tier": "a"})
    a2 = await start_pod({"tier": "a"})
    b = await start_pod({"tier": "b"})
    gw = await start_gateway(make_config([a1, a2, b], EPP), debug_routes=True)
    status, doc = await post(gw.url + "/debug/route/v1/chat/completions", BODY)
    assert status == 200, doc
    assert doc["forwarded"] is False and doc["primary_profile"] == "default"
    (profile,) = doc["profiles"]
    assert sorted(profile["candidates"]) == sorted([a1.name, a2.name, b.name])
    assert profile["filters"] == [{"filter": "by-label", "kept": [a1.name, a2.name]}]
    scorers = {s["scorer"]: s for s in profile["scorers"]}
    assert scorers["queue-scorer"]["weight"] == 2
    for s in scorers.values():
        assert set(s["raw"]) == {a1.name, a2.name}
        for pod, raw in s["raw"].items():
            assert s["weighted"][pod] == pytest.approx(s["weight"] * min(1.0, max(0.0, raw)))
    for pod, total in profile["totals"].items():
        assert total == pytest.approx(sum(s["weighted"][pod] for s in scorers.values()))
    assert doc["pick"]["name"] == profile["picked"][0] in (a1.name, a2.name)
    assert a1.pod.received == a2.pod.received == b.pod.received == []
    assert gw.running() == 0


async def test_debug_route_answers_errors_like_the_real_route(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config([await start_pod()], EPP), debug_routes=True)
    status, doc = await post(gw.url + "/debug/route/v1/completions", {"model": "nope"})
    assert status == 404 and doc["error"]["code"] == "model_not_found"


async def test_debug_routes_are_off_by_default(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config([await start_pod()], EPP))
    status, doc = await post(gw.url + "/debug/route/v1/chat/completions", BODY)
    assert status == 404 and doc["error"]["code"] == "not_found"
