"""A reload keeps what the gateway learned (framework.inherit), end to end over simulated
pods: a Responses-API conversation started before a reload continues after it, and prompts
keep going to the pod that holds their prefix when the reload adds a pod."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.conftest import GatewayFactory, PodFactory, RunningGateway, RunningPod, make_config

MODEL = "sim-model"

PREFIX_EPP: dict[str, Any] = {
    "plugins": [{"type": "prefix-cache-scorer"}, {"type": "max-score-picker"}],
}
STORE_EPP: dict[str, Any] = {
    "featureGates": ["prepareDataPlugins"],
    "plugins": [{"type": "random-picker"}, {"type": "responses-store"}],
}


async def sent_to(http: aiohttp.ClientSession, gw: RunningGateway, prompt: str) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    async with http.post(gw.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return r.headers["x-sim-pod"]


async def test_prompts_stay_on_the_pod_holding_their_prefix_across_a_reload(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods: list[RunningPod] = [await start_pod() for _ in range(3)]
    gw = await start_gateway(make_config(pods[:2], PREFIX_EPP))
    prompts = [f"Conversation {i}: " + "tell me about the history of tea. " * 12 for i in range(6)]
    async with aiohttp.ClientSession() as http:
        before = [await sent_to(http, gw, p) for p in prompts]
        await gw.gateway.reload(make_config(pods, PREFIX_EPP))  # a third pod joins
        assert gw.gateway.routing.inherited == ["approx-prefix-cache-producer"]
        # An empty index would score every pod 0 and pick among the three at random (each
        # prompt kept its pod with chance 1/3: all six about once in 700 runs).
        assert [await sent_to(http, gw, p) for p in prompts] == before

        # pod-0 replaced by a fresh server under the same name: what it held is forgotten
        index = gw.gateway.routing.plugins.plugins["approx-prefix-cache-producer"].index  # type: ignore[attr-defined]
        assert (index.size("pod-0") > 0) == ("pod-0" in before)  # (all six on pod-1: 1 in 64)
        fresh = await start_pod(name="pod-0")
        await gw.gateway.reload(make_config([fresh, *pods[1:]], PREFIX_EPP))
        assert index.size("pod-0") == 0
        assert (index.size("pod-1") > 0) == ("pod-1" in before)


async def test_a_conversation_continues_across_a_reload(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(), await start_pod()]
    gw = await start_gateway(make_config(pods, STORE_EPP))
    async with aiohttp.ClientSession() as http:
        first = {"model": MODEL, "input": "My name is Ada.", "max_output_tokens": 3}
        async with http.post(gw.url + "/v1/responses", json=first) as r:
            assert r.status == 200, await r.text()
            first_id = (await r.json())["id"]
        await gw.gateway.reload(make_config(pods[:1], STORE_EPP))
        assert gw.gateway.routing.inherited == ["responses-store"]
        then = {"model": MODEL, "input": "What is my name?", "previous_response_id": first_id}
        async with http.post(gw.url + "/v1/responses", json=then) as r:
            assert r.status == 200, await r.text()
        async with http.get(f"{gw.url}/v1/responses/{first_id}") as r:
            assert r.status == 200, await r.text()
    # the second turn reached the pod with the first one's input and output before it
    (body,) = [
        q.json() for q in pods[0].pod.received
        if q.path == "/v1/responses" and "What is my name?" in str(q.json()["input"])
    ]  # fmt: skip
    assert body["input"][0] == {"type": "message", "role": "user", "content": "My name is Ada."}


async def test_a_shutdown_during_a_drain_still_stops_the_replaced_routing(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod(time_scale=1.0)  # a stream of 100 tokens takes about a second
    gw = await start_gateway(make_config([pod], PREFIX_EPP))
    old = gw.gateway.routing
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 100, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            await r.content.readline()  # streaming: the old routing has a request in flight
            await gw.gateway.reload(make_config([pod], PREFIX_EPP))
            assert old.in_flight == 1 and old.refresher is not None and old.refresher._running
            await gw.gateway.stop_replaced()  # what shutdown does, while the stream runs
            assert old.in_flight == 1
    assert not old.refresher._running  # the old routing was stopped all the same
