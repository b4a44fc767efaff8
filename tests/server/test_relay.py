"""The relay: bytes and headers in both directions, streaming, disconnects, fallback."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import GatewayFactory, PodFactory, eventually, make_config

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_body_bytes_and_headers_forwarded(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    # Odd spacing and key order: the pod must receive exactly these bytes.
    raw = b'{ "messages":[{"content":"hi","role":"user"}],   "model":"sim-model" ,"max_tokens":2}'
    headers = {
        "Content-Type": "application/json",
        "Authorization": "Bearer secret",
        "X-Custom": "kept",
        "mif-prefill-endpoint": "10.0.0.1:8000",
        "x-gateway-destination-endpoint": "10.0.0.1:8000",
        "x-decoder-host-port": "10.0.0.1:8000",
        "Connection": "keep-alive, X-Drop-Me",
        "X-Drop-Me": "hop-by-hop via Connection",
        "TE": "trailers",
    }
    async with aiohttp.ClientSession(skip_auto_headers=["Accept-Encoding", "User-Agent"]) as http:
        async with http.post(f"{gw.url}/v1/chat/completions", data=raw, headers=headers) as r:
            assert r.status == 200
            assert r.headers["x-sim-pod"] == pod.name
            assert r.headers["Content-Type"] == "application/json"
            await r.read()
    got = pod.pod.received[-1]
    assert got.body == raw
    sent = {k.lower(): v for k, v in got.headers.items()}
    assert sent["authorization"] == "Bearer secret"
    assert sent["x-custom"] == "kept"
    assert sent["content-type"] == "application/json"
    for dropped in (
        "mif-prefill-endpoint",
        "x-gateway-destination-endpoint",
        "x-decoder-host-port",
        "x-drop-me",
        "te",
    ):
        assert dropped not in sent
    # the gateway adds no headers of its own (no compression negotiation, no user agent)
    assert "accept-encoding" not in sent
    assert "user-agent" not in sent


async def test_first_chunk_arrives_before_upstream_finishes(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    pod.pod.hold = asyncio.Event()
    gw = await start_gateway(make_config([pod]))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
            assert b'"role":"assistant"' in first
            assert pod.pod.completed == 0  # the upstream is still held
            pod.pod.hold.set()
            rest = await r.read()
    assert rest.endswith(b"data: [DONE]\n\n")
    assert pod.pod.completed == 1


async def test_client_disconnect_cancels_upstream(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    pod.pod.hold = asyncio.Event()
    gw = await start_gateway(make_config([pod]))
    async with aiohttp.ClientSession() as http:
        r = await http.post(
            f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x", "stream": True}
        )
        await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
        assert gw.running() == 1
        r.close()  # drop the connection mid-stream
    await eventually(lambda: pod.pod.cancelled == 1)
    await eventually(lambda: gw.running() == 0)
    assert pod.pod.running == 0


async def test_client_disconnect_while_waiting_for_non_stream_response(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod(step_base=30.0, time_scale=1.0)  # one engine step: 30 s
    gw = await start_gateway(make_config([pod]))
    async with aiohttp.ClientSession() as http:
        task = asyncio.create_task(
            http.post(f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x"})
        )
        await eventually(lambda: pod.pod.running == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await eventually(lambda: pod.pod.cancelled == 1)
    await eventually(lambda: gw.running() == 0)


async def test_unreachable_pod_falls_back_to_next_best(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    live = await start_pod()
    live.pod.metrics_override = {"waiting": 10}  # the dead pod looks better to queue-scorer
    dead = {"name": "dead", "url": f"http://127.0.0.1:{_free_port()}", "models": ["sim-model"]}
    gw = await start_gateway(make_config([live], extra_endpoints=[dead]), metrics_interval=30.0)
    assert gw.gateway.pool.get("dead").healthy  # one failed scrape is not enough
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
            assert r.headers["x-sim-pod"] == live.name
    assert (
        gw.metric(
            "inference_objective_upstream_failures_total", {"pod": "dead", "reason": "connect"}
        )
        == 1
    )
    assert gw.running() == 0


async def test_every_pod_unreachable_is_502(start_gateway: GatewayFactory) -> None:
    dead = [
        {"name": f"dead-{i}", "url": f"http://127.0.0.1:{_free_port()}", "models": ["sim-model"]}
        for i in range(2)
    ]
    gw = await start_gateway(make_config([], extra_endpoints=dead), metrics_interval=30.0)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 502
            body = await r.json()
    assert body["error"]["type"] == "server_error"
    assert body["error"]["code"] == "upstream_unreachable"
    # the attempts are counted, but no pod's name or address reaches the client
    assert "2 attempts failed" in body["error"]["message"]
    for pod in dead:
        assert pod["name"] not in body["error"]["message"]
        assert pod["url"].split("//")[1] not in str(body)
    assert gw.running() == 0


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_retryable_status_before_the_first_byte_goes_to_the_next_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory, status: int
) -> None:
    bad, good = await start_pod(), await start_pod()
    bad.pod.fail_status = status
    good.pod.metrics_override = {"waiting": 10}  # the scheduler prefers the bad pod
    gw = await start_gateway(make_config([bad, good]))
    await eventually(lambda: gw.gateway.pool.get(good.name).metrics.waiting == 10)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200, await r.text()
    assert len(bad.pod.received) == 1 and len(good.pod.received) == 1
    assert gw.metric(
        "inference_objective_upstream_failures_total", {"pod": bad.name, "reason": str(status)}
    ) == 1  # fmt: skip
    assert gw.metric("inference_objective_retries_total", {"reason": str(status)}) == 1
    assert gw.running() == 0


async def test_a_pod_a_filter_kept_alone_still_fails_over(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # prefix affinity narrows the candidates to the one warm pod; when it fails, the request
    # is scheduled again without it instead of relaying its 503
    pods = [await start_pod(), await start_pod()]
    epp = {
        "plugins": [
            {"type": "prefix-cache-scorer"},
            {"type": "prefix-cache-affinity-filter"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "prefix-cache-affinity-filter"},
                    {"pluginRef": "prefix-cache-scorer"},
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
    }
    gw = await start_gateway(make_config(pods, epp))
    body = {"model": "sim-model", "prompt": "warm " * 400, "max_tokens": 2}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            assert r.status == 200
            warm = next(p for p in pods if p.name == r.headers["x-sim-pod"])
        warm.pod.fail_status = 503
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            assert r.headers["x-sim-pod"] != warm.name
    assert len(warm.pod.received) == 2


async def test_other_statuses_and_the_last_pods_answer_pass_through(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    bad, good = await start_pod(), await start_pod()
    bad.pod.fail_status = 400  # the request itself: another pod would say the same
    good.pod.metrics_override = {"waiting": 10}
    gw = await start_gateway(make_config([bad, good]))
    await eventually(lambda: gw.gateway.pool.get(good.name).metrics.waiting == 10)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 400
            body = await r.json()
    assert body["error"]["message"] == f"simulated failure on {bad.name}"
    assert good.pod.received == []

    only = await start_pod()
    only.pod.fail_status = 503
    gw1 = await start_gateway(make_config([only]))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw1.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 503  # no other pod: the pod's own answer, not a gateway 502
            assert (await r.json())["error"]["message"] == f"simulated failure on {only.name}"
    assert (
        gw1.metric(
            "inference_objective_request_total",
            {"model_name": "sim-model", "target_model_name": "sim-model", "pod": only.name,
             "code": "503"},
        )
        == 1
    )  # fmt: skip


def test_the_retry_budget_and_backoff() -> None:
    from heimdall_proxy.resilience.retry import MAX_BACKOFF, MAX_RETRY_AFTER, RetryBudget, backoff

    b = RetryBudget(ratio=0.2, min_concurrency=3)
    b.in_flight, b.retries = 100, 19
    assert b.allows()
    b.retries = 20
    assert not b.allows()  # 20% of 100 in flight
    b.in_flight, b.retries = 1, 2
    assert b.allows()  # the floor of 3
    assert all(0 <= backoff(n) <= MAX_BACKOFF for n in range(1, 10))
    assert backoff(1, {"Retry-After": "0.5"}) == 0.5
    assert backoff(1, {"Retry-After": "120"}) == MAX_RETRY_AFTER


async def test_upstream_breaking_mid_stream_breaks_the_client_stream(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    pod.pod.break_stream_after = 2
    gw = await start_gateway(make_config([pod]))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        pod.pod.break_stream_after = None
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
    assert (
        gw.metric(
            "inference_objective_upstream_failures_total", {"pod": pod.name, "reason": "stream"}
        )
        == 1
    )
    assert gw.running() == 0


async def test_response_header_flag(start_pod: PodFactory, start_gateway: GatewayFactory) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]), response_header=True)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.headers["x-decoder-host-port"] == f"127.0.0.1:{pod.server.port}"
            assert "x-prefiller-host-port" not in r.headers
            await r.read()


async def test_no_response_header_without_flag(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert "x-decoder-host-port" not in r.headers


async def test_pod_cookies_reach_the_client_but_are_never_replayed(
    aiohttp_server: Any, start_gateway: GatewayFactory
) -> None:
    seen_cookies: list[str | None] = []

    async def completions(request: web.Request) -> web.Response:
        seen_cookies.append(request.headers.get("Cookie"))
        resp = web.json_response({"id": "x", "choices": []})
        resp.set_cookie("pod_session", "secret-of-client-1")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    server = await aiohttp_server(app)
    # a host name, not an IP: aiohttp's default jar only keeps cookies of named hosts
    pod = {"name": "cookie-pod", "url": f"http://localhost:{server.port}", "models": ["m"]}
    gw = await start_gateway(make_config([], extra_endpoints=[pod]), metrics_interval=30.0)
    body = {"model": "m", "prompt": "x"}
    for _ in range(2):  # two different clients
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
                assert "pod_session=secret-of-client-1" in r.headers["Set-Cookie"]
    assert seen_cookies == [None, None]


async def test_a_pod_silent_past_the_first_byte_timeout_is_replaced(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    slow = await start_pod(step_base=0.05, time_scale=1.0)  # 20 tokens unstreamed: about 1 s
    fast = await start_pod()
    fast.pod.metrics_override = {"waiting": 10}  # the scheduler prefers the slow pod
    gw = await start_gateway(make_config([slow, fast]), first_byte_timeout=0.3)
    await eventually(lambda: gw.gateway.pool.get(fast.name).metrics.waiting == 10)
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 20, "ignore_eos": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            assert r.status == 200
    assert len(slow.pod.received) == 1 and len(fast.pod.received) == 1


async def test_a_stream_silent_past_the_idle_timeout_breaks_and_counts(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    pod.pod.hold = asyncio.Event()  # the stream stops after its first chunk
    gw = await start_gateway(make_config([pod]), stream_idle_timeout=0.3)
    body = {**CHAT, "stream": True, "max_tokens": 5}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
    assert gw.metric(
        "inference_objective_upstream_failures_total", {"pod": pod.name, "reason": "stream"}
    ) == 1  # fmt: skip
    pod.pod.hold.set()
