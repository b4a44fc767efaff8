"""What is not theirs stays out of reach: stored responses of another caller, API keys,
body fields that steer pods, routes, request targets, connections, content encodings.
Everything runs against real simulated pods; the connection tests run the real listener."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from heimdall_proxy.config.gateway import GatewayConfig
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.server.app import create_app, serve
from tests.conftest import GatewayFactory, PodFactory, RunningGateway, eventually, make_config

STORE = {
    "featureGates": ["prepareDataPlugins"],
    "plugins": [{"type": "random-picker"}, {"type": "responses-store"}],
}
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def call(
    gw: RunningGateway | str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    base = gw if isinstance(gw, str) else gw.url
    async with aiohttp.ClientSession() as http:
        async with http.request(method, base + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)


def as_user(name: str) -> dict[str, str]:
    return {"x-user": name}


# ---- stored responses belong to their owner --------------------------------------------------


async def test_a_second_user_cannot_read_continue_delete_or_overwrite_a_stored_response(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod], STORE), owner_header="x-user")
    body = {"model": "sim-model", "input": "alice's secret", "max_output_tokens": 3}
    status, alice = await call(gw, "POST", "/v1/responses", body, as_user("alice"))
    assert status == 200, alice
    rid = alice["id"]
    path = f"/v1/responses/{rid}"

    for method, where in (("GET", path), ("GET", path + "/input_items"), ("DELETE", path)):
        status, doc = await call(gw, method, where, headers=as_user("mallory"))
        assert status == 404, (method, where, doc)
    cont = {**body, "input": "and then?", "previous_response_id": rid}
    status, doc = await call(gw, "POST", "/v1/responses", cont, as_user("mallory"))
    assert status == 404 and doc["error"]["code"] == "previous_response_not_found"

    # choosing alice's id as request_id does not let mallory's response replace hers
    forged = {**body, "input": "forged", "request_id": rid}
    status, doc = await call(gw, "POST", "/v1/responses", forged, as_user("mallory"))
    assert status == 200 and doc["id"] != rid
    assert all("request_id" not in r.json() for r in pod.pod.received)

    status, mine = await call(gw, "GET", path, headers=as_user("alice"))
    assert status == 200 and mine["id"] == rid
    status, _ = await call(gw, "DELETE", path, headers=as_user("alice"))
    assert status == 200


# ---- API keys ------------------------------------------------------------------------------------


async def test_api_keys_guard_every_route_but_health_ready_and_metrics(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]), api_keys=("k-user",), admin_api_keys=("k-adm",))
    for headers in (None, {"Authorization": "Bearer nope"}, {"Authorization": "Basic k-user"}):
        status, doc = await call(gw, "POST", "/v1/chat/completions", CHAT, headers)
        assert status == 401 and doc["error"]["code"] == "invalid_api_key", doc
        assert (await call(gw, "GET", "/v1/models", headers=headers))[0] == 401
    assert pod.pod.received == []
    for key in ("k-user", "k-adm"):
        status, _ = await call(
            gw, "POST", "/v1/chat/completions", CHAT, {"Authorization": f"Bearer {key}"}
        )
        assert status == 200
    for open_path in ("/health", "/ready"):
        assert (await call(gw, "GET", open_path))[0] == 200
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as resp:
        assert resp.status == 200


def test_keys_are_never_in_the_options_repr() -> None:
    assert "k-secret" not in repr(ServerOptions(api_keys=("k-secret",)))
    assert "k-secret" not in repr(ServerOptions(upstream_api_key="k-secret"))


async def test_the_gateway_key_never_reaches_a_pod_and_the_pod_key_does(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    user = {"Authorization": "Bearer k-user", "x-trace": "1"}
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]), api_keys=("k-user",))
    assert (await call(gw, "POST", "/v1/chat/completions", CHAT, user))[0] == 200
    got = {k.lower(): v for k, v in pod.pod.received[-1].headers.items()}
    assert "authorization" not in got and got["x-trace"] == "1"

    # pods started with vLLM's --api-key: the gateway sends its own key for them, in place
    # of the client's, on requests and on the /v1/models scrape alike
    locked = await start_pod(api_key="k-pod")
    gw = await start_gateway(make_config([locked]), api_keys=("k-user",), upstream_api_key="k-pod")
    await eventually(lambda: bool(gw.gateway.pool.models()))
    status, doc = await call(gw, "POST", "/v1/chat/completions", CHAT, user)
    assert status == 200, doc
    assert locked.pod.received[-1].headers["Authorization"] == "Bearer k-pod"
    status, models = await call(gw, "GET", "/v1/models", headers=user)
    assert status == 200 and [m["id"] for m in models["data"]] == ["sim-model"]

    # no gateway keys and no pod key: the client's Authorization is the pods' business
    open_gw = await start_gateway(make_config([pod]))
    mine = {"Authorization": "Bearer for-the-pod"}
    assert (await call(open_gw, "POST", "/v1/chat/completions", CHAT, mine))[0] == 200
    assert pod.pod.received[-1].headers["Authorization"] == "Bearer for-the-pod"


# ---- body fields and routes -----------------------------------------------------------------------


async def test_client_transfer_params_are_dropped_unless_trusted(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    steer = {"kv_transfer_params": {"remote_host": "10.0.0.66", "remote_port": 5600},
             "ec_transfer_params": {"x": {"do_remote_encode": True}}}  # fmt: skip
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    assert (await call(gw, "POST", "/v1/chat/completions", {**CHAT, **steer}))[0] == 200
    got = pod.pod.received[-1].json()
    assert "kv_transfer_params" not in got and "ec_transfer_params" not in got
    # vLLM reads kv_transfer_params from vllm_xargs too: dropped there, the rest kept
    xargs = {"vllm_xargs": {"kv_transfer_params": {"remote_host": "10.0.0.66"}, "seed_x": 1}}
    assert (await call(gw, "POST", "/v1/chat/completions", {**CHAT, **xargs}))[0] == 200
    assert pod.pod.received[-1].json()["vllm_xargs"] == {"seed_x": 1}
    trusted = await start_gateway(make_config([pod]), trust_client_transfer_params=True)
    assert (await call(trusted, "POST", "/v1/chat/completions", {**CHAT, **steer}))[0] == 200
    assert pod.pod.received[-1].json()["kv_transfer_params"]["remote_host"] == "10.0.0.66"


async def test_only_inference_routes_are_forwarded_unless_allowlisted(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    admin_route = {"lora_name": "x", "lora_path": "/tmp/x"}
    gw = await start_gateway(make_config([pod]))
    status, doc = await call(gw, "POST", "/v1/load_lora_adapter", admin_route)
    assert status == 404 and doc["error"]["code"] == "not_found"
    status, _ = await call(gw, "POST", "/tokenize", {"model": "sim-model", "prompt": "a b"})
    assert status == 404
    assert pod.pod.received == []

    keyed = await start_gateway(
        make_config([pod]),
        allow_routes=("/tokenize",),
        api_keys=("k-user",),
        admin_api_keys=("k-adm",),
    )
    tok = {"model": "sim-model", "prompt": "a b"}
    user, adm = {"Authorization": "Bearer k-user"}, {"Authorization": "Bearer k-adm"}
    status, doc = await call(keyed, "POST", "/tokenize", tok, user)
    assert status == 403 and doc["error"]["code"] == "permission_denied"
    status, doc = await call(keyed, "POST", "/tokenize", tok, adm)
    assert status == 200 and doc["tokens"], doc


# ---- the real listener: targets, connections, malformed requests, encodings ----------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def listening(config: GatewayConfig, **options: Any) -> AsyncIterator[str]:
    opts = ServerOptions(host="127.0.0.1", port=free_port(), metrics_interval=0.02, **options)
    task = asyncio.create_task(serve(create_app(config, opts), opts))
    for _ in range(200):
        with contextlib.suppress(OSError):
            _, w = await asyncio.open_connection("127.0.0.1", opts.port)
            w.close()
            break
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{opts.port}"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def raw(url: str, data: bytes, wait: float = 3.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(port))
    w.write(data)
    await w.drain()
    try:
        return await asyncio.wait_for(r.read(65536), wait)
    finally:
        w.close()


def status_and_json(reply: bytes) -> tuple[int, Any]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


@pytest.mark.parametrize(
    "target",
    [b"/v1/../v1/chat/completions", b"/v1/%2E%2E/v1/chat/completions",
     b"/v1/%2e%2e%2fv1/chat/completions", b"http://169.254.169.254/v1/chat/completions"],
)  # fmt: skip
async def test_dot_dot_and_absolute_form_targets_are_400(
    start_pod: PodFactory, target: bytes
) -> None:
    pod = await start_pod()
    async with listening(make_config([pod])) as url:
        body = orjson.dumps(CHAT)
        reply = await raw(
            url, b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body,
        )  # fmt: skip
    status, doc = status_and_json(reply)
    assert status == 400 and doc["error"]["code"] == "invalid_path"
    assert pod.pod.received == []


async def test_malformed_requests_get_openai_shaped_json(start_pod: PodFactory) -> None:
    async with listening(make_config([await start_pod()])) as url:
        status, doc = status_and_json(await raw(url, b"GARBAGE\r\n\r\n"))
    assert status == 400 and doc["error"]["code"] == "bad_request"


@pytest.mark.slow
async def test_idle_and_slowloris_connections_are_closed(start_pod: PodFactory) -> None:
    async with listening(make_config([await start_pod()]), keepalive_timeout=0.5) as url:
        host, port = url.removeprefix("http://").split(":")
        idle_r, idle_w = await asyncio.open_connection(host, int(port))
        slow_r, slow_w = await asyncio.open_connection(host, int(port))
        slow_w.write(b"GET /health HTTP/1.1\r\n")
        for _ in range(4):  # a header line every 0.3 s never completes the request
            await asyncio.sleep(0.3)
            with contextlib.suppress(ConnectionError):
                slow_w.write(b"X-Slow: 1\r\n")
        assert await asyncio.wait_for(idle_r.read(), 3.0) == b""
        with contextlib.suppress(ConnectionError):
            assert b"200" not in await asyncio.wait_for(slow_r.read(), 3.0)
        idle_w.close()
        slow_w.close()


@pytest.mark.uvloop
async def test_connections_over_the_cap_get_503(
    start_pod: PodFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with listening(make_config([await start_pod()]), max_connections=2) as url:
        host, port = url.removeprefix("http://").split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
        # The server counts a connection when its loop accepts it, and forgets it when it
        # sees it closed: polled for, not slept on (a loaded machine is slower than any
        # fixed wait).
        status, doc = await health_until(url, 503)
        assert status == 503 and doc["error"]["code"] == "too_many_connections"
        # a burst over the cap: every connection is answered, and the log gets one line
        caplog.clear()
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        replies = await asyncio.gather(*(raw(url, request) for _ in range(20)))
        assert all(status_and_json(r)[0] == 503 for r in replies)
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) <= 1
        for _, w in held:
            w.close()
        assert (await health_until(url, 200))[0] == 200


async def health_until(url: str, want: int, within: float = 10.0) -> tuple[int, Any]:
    """GET /health on a new connection until it answers `want`; the last answer."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        status, doc = status_and_json(await raw(url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
        if status == want or asyncio.get_running_loop().time() > deadline:
            return status, doc
        await asyncio.sleep(0.02)


async def test_a_gzip_body_is_forwarded_decoded_without_its_encoding(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    async with aiohttp.ClientSession() as http:
        async with http.post(
            gw.url + "/v1/chat/completions",
            data=gzip.compress(orjson.dumps(CHAT)),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 200, await resp.text()
    got = pod.pod.received[-1]
    assert got.json()["messages"] == CHAT["messages"]
    assert "content-encoding" not in {k.lower() for k in got.headers}


@pytest.mark.uvloop
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_is_not_in_its_content_encoding_is_400_without_a_traceback(
    start_pod: PodFactory, caplog: pytest.LogCaptureFixture, encoding: str
) -> None:
    async with listening(make_config([await start_pod()])) as url:
        body = orjson.dumps(CHAT)  # plain JSON, though the header says it is compressed
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Encoding: " + encoding.encode() +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )  # fmt: skip
        status, doc = status_and_json(await raw(url, head + body))
        assert status == 400, doc
        assert doc["error"]["code"] == "invalid_body"
        assert doc["error"]["type"] == "invalid_request_error"
        good = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )  # fmt: skip
        assert status_and_json(await raw(url, good))[0] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_body_sent_too_slowly_is_408_and_a_whole_body_is_served(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """A body that arrives with its headers is read without a timer; one that trickles in
    past --body-timeout is answered 408, OpenAI-shaped, and the gateway keeps serving."""
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]), body_timeout=0.3)
    body = b'{"model":"sim-model","prompt":"hi","max_tokens":2}'
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    status, doc = status_and_json(await raw(gw.url, head + body))
    assert status == 200 and doc["choices"]
    # Half the body, then silence: the read must time out.
    status, doc = status_and_json(await raw(gw.url, head + body[:10], wait=5.0))
    assert status == 408
    assert doc["error"]["code"] == "request_timeout"
    status, _ = status_and_json(await raw(gw.url, head + body))
    assert status == 200
