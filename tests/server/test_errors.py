"""Bad input: a clear OpenAI-shaped error, the gateway still serves the next request, and no
counter stays raised."""

from __future__ import annotations

import random
from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayFactory, PodFactory, RunningGateway, make_config

GOOD = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'

# (name, method, path, body, headers, status, error code, param)
CASES: list[tuple[str, str, str, bytes, dict[str, str], int, str | None, str | None]] = [
    ("invalid json", "POST", "/v1/chat/completions", b'{"model": ', {}, 400, "invalid_json", None),
    ("empty body", "POST", "/v1/completions", b"", {}, 400, "invalid_json", None),
    ("body is an array", "POST", "/v1/chat/completions", b"[1, 2]", {}, 400, "invalid_json", None),
    ("body is a string", "POST", "/v1/responses", b'"hello"', {}, 400, "invalid_json", None),
    (
        "invalid utf-8",
        "POST",
        "/v1/completions",
        b'{"model":"sim-model","prompt":"\xff\xfe"}',
        {},
        400,
        "invalid_encoding",
        None,
    ),
    (
        "missing model",
        "POST",
        "/v1/chat/completions",
        b'{"messages":[]}',
        {},
        400,
        "invalid_value",
        "model",
    ),
    (
        "empty model",
        "POST",
        "/v1/completions",
        b'{"model":"","prompt":"x"}',
        {},
        400,
        "invalid_value",
        "model",
    ),
    (
        "model not a string",
        "POST",
        "/v1/completions",
        b'{"model":42,"prompt":"x"}',
        {},
        400,
        "invalid_value",
        "model",
    ),
    (
        "messages not a list",
        "POST",
        "/v1/chat/completions",
        b'{"model":"sim-model","messages":"hi"}',
        {},
        400,
        "invalid_value",
        "messages",
    ),
    (
        "messages missing",
        "POST",
        "/v1/chat/completions",
        b'{"model":"sim-model"}',
        {},
        400,
        "invalid_value",
        "messages",
    ),
    (
        "message not an object",
        "POST",
        "/v1/chat/completions",
        b'{"model":"sim-model","messages":[1]}',
        {},
        400,
        "invalid_value",
        "messages.0",
    ),
    (
        "stream not a bool",
        "POST",
        "/v1/chat/completions",
        b'{"model":"sim-model","messages":[],"stream":"maybe"}',
        {},
        400,
        "invalid_value",
        "stream",
    ),
    (
        "max_tokens not an int",
        "POST",
        "/v1/completions",
        b'{"model":"sim-model","prompt":"x","max_tokens":"lots"}',
        {},
        400,
        "invalid_value",
        "max_tokens",
    ),
    (
        "prompt wrong type",
        "POST",
        "/v1/completions",
        b'{"model":"sim-model","prompt":{"a":1}}',
        {},
        400,
        "invalid_value",
        "prompt",
    ),
    (
        "input wrong type",
        "POST",
        "/v1/responses",
        b'{"model":"sim-model","input":5}',
        {},
        400,
        "invalid_value",
        "input",
    ),
    (
        "deeply nested json",
        "POST",
        "/v1/completions",
        b"[" * 2000 + b"]" * 2000,
        {},
        400,
        "invalid_json",
        None,
    ),
    (
        "unknown model",
        "POST",
        "/v1/completions",
        b'{"model":"gpt-nope","prompt":"x"}',
        {},
        404,
        "model_not_found",
        "model",
    ),
    ("unknown route", "GET", "/v2/whatever", b"", {}, 404, "not_found", None),
    ("wrong method", "GET", "/v1/chat/completions", b"", {}, 405, "method_not_allowed", None),
    (
        "body too large (declared)",
        "POST",
        "/v1/completions",
        b"x" * 5000,
        {},
        413,
        "request_too_large",
        None,
    ),
]


@pytest.fixture
async def gw(start_pod: PodFactory, start_gateway: GatewayFactory) -> RunningGateway:
    pod = await start_pod()
    return await start_gateway(make_config([pod]), max_body_bytes=4096)


async def _assert_good(http: aiohttp.ClientSession, gw: RunningGateway) -> None:
    async with http.post(f"{gw.url}/v1/chat/completions", data=GOOD) as r:
        assert r.status == 200, await r.text()


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "headers", "status", "code", "param"),
    CASES,
    ids=[c[0] for c in CASES],
)
async def test_bad_input(
    gw: RunningGateway,
    name: str,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    code: str | None,
    param: str | None,
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"{gw.url}{path}", data=body, headers=headers) as r:
            assert r.status == status
            assert r.headers["Content-Type"].startswith("application/json")
            doc: dict[str, Any] = await r.json()
        err = doc["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
        assert err["code"] == code
        assert err["param"] == param
        await _assert_good(http, gw)
    assert gw.running() == 0


async def test_unrouted_requests_name_the_allowed_methods(gw: RunningGateway) -> None:
    async with aiohttp.ClientSession() as http:
        for method, path, allow in (
            ("PUT", "/v1/chat/completions", "POST"),
            ("DELETE", "/health", "GET,HEAD"),
            ("PATCH", "/nowhere", None),
        ):
            async with http.request(method, f"{gw.url}{path}") as r:
                assert r.status == (405 if allow else 404)
                assert r.headers.get("Allow") == allow
                assert (await r.json())["error"]["code"] == (
                    "method_not_allowed" if allow else "not_found"
                )
        async with http.head(f"{gw.url}/health") as r:
            assert r.status == 200


async def test_chunked_body_over_limit_is_413(gw: RunningGateway) -> None:
    async def chunks() -> Any:
        for _ in range(10):
            yield b"x" * 1000

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", data=chunks()) as r:
            assert r.status == 413
            assert (await r.json())["error"]["code"] == "request_too_large"
        await _assert_good(http, gw)


async def test_no_candidate_is_503_with_retry_after(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod(labels={"tier": "gold"})
    epp = {
        "plugins": [
            {"type": "by-label", "parameters": {"label": "tier", "validValues": ["silver"]}},
            {"type": "queue-scorer"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": "by-label"}, {"pluginRef": "queue-scorer"}],
            }
        ],
    }
    gw = await start_gateway(make_config([pod], epp))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", data=GOOD) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "1"
            doc = await r.json()
    assert doc["error"]["code"] == "no_endpoint_available"
    assert doc["error"]["type"] == "server_error"
    assert pod.pod.received == []


async def test_empty_pool_is_503(start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(make_config([]))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", data=GOOD) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == "no_endpoint_available"
        async with http.get(f"{gw.url}/ready") as r:
            assert r.status == 503


class _Boom:
    """A plugin with a bug: it raises whether asked to filter or to score."""

    type = name = "boom"

    def filter(self, *args: Any) -> list[Any]:
        raise RuntimeError("plugin bug")

    def score(self, *args: Any) -> dict[str, float]:
        raise RuntimeError("plugin bug")


async def _post_with_boom(
    start_pod: PodFactory, start_gateway: GatewayFactory, point: str
) -> tuple[int, Any, Any, Any]:
    """One chat request through a gateway whose default profile has _Boom as a filter or a
    scorer (`point`): the status, the JSON body (None unless an error), the pod, the gateway."""
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    profile = gw.gateway.plugins.scheduler.profiles["default"]
    if point == "filter":
        profile._filters.append((_Boom(), "boom", lambda _s: None))  # type: ignore[arg-type]
    else:
        profile._scorers.append((_Boom(), 1.0, "boom", lambda _s: None))  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", data=GOOD) as r:
            if r.status == 200:
                await r.read()
                return r.status, None, pod, gw
            return r.status, await r.json(), pod, gw


async def test_plugin_crash_is_500_and_releases_counters(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    status, doc, _, gw = await _post_with_boom(start_pod, start_gateway, "filter")
    assert status == 500
    assert doc["error"]["code"] == "internal_error"
    assert "plugin bug" not in doc["error"]["message"]  # internals are not leaked
    assert gw.running() == 0


async def test_a_scorer_that_crashes_is_left_out_and_the_request_served(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # a scorer only ranks pods the filters allowed: its bug must not fail the request
    status, _, pod, gw = await _post_with_boom(start_pod, start_gateway, "scorer")
    assert status == 200
    assert len(pod.pod.received) == 1
    assert gw.running() == 0


async def test_random_garbage_never_breaks_the_gateway(gw: RunningGateway) -> None:
    """Mutated bodies and odd paths: every answer is a clean status, never a crash."""
    rng = random.Random(1234)
    base = bytearray(GOOD)
    paths = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            body = bytearray(base)
            for _ in range(rng.randint(1, 6)):
                op = rng.random()
                pos = rng.randrange(len(body) + 1)
                if op < 0.4 and body:
                    body[min(pos, len(body) - 1)] = rng.randrange(256)
                elif op < 0.7:
                    body[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
                else:
                    del body[pos : pos + rng.randint(1, 8)]
            path = rng.choice(paths)
            async with http.post(f"{gw.url}{path}", data=bytes(body)) as r:
                assert r.status in (200, 400, 404, 413), (r.status, bytes(body))
                if r.status != 200:
                    assert set((await r.json())["error"]) == {"message", "type", "param", "code"}
                else:
                    await r.read()
        await _assert_good(http, gw)
    assert gw.running() == 0
