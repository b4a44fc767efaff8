"""responses-store end to end: the OpenAI SDK through the gateway, over two simulated pods
picked at random, so a conversation only works if the gateway makes every turn
self-contained."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import GatewayFactory, PodFactory, RunningGateway, RunningPod, make_config

MODEL = "sim-model"


def store_epp(store_config: dict[str, Any] | None = None) -> dict[str, Any]:
    store: dict[str, Any] = {"type": "responses-store"}
    if store_config is not None:
        store["parameters"] = {"storeConfig": store_config}
    return {
        "featureGates": ["prepareDataPlugins"],
        "plugins": [{"type": "random-picker"}, store],
    }


def sdk_for(gw: RunningGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="test", max_retries=0)


def responses_bodies(pods: list[RunningPod]) -> list[dict[str, Any]]:
    return [r.json() for p in pods for r in p.pod.received if r.path == "/v1/responses"]


def body_ending_with(pods: list[RunningPod], text: str) -> dict[str, Any]:
    """The body a pod received whose last input item is the user message `text`."""
    found = []
    for body in responses_bodies(pods):
        inp = body.get("input")
        last = inp[-1] if isinstance(inp, list) and inp else inp
        content = last.get("content") if isinstance(last, dict) else last
        if content == text:
            found.append(body)
    assert len(found) == 1, (text, responses_bodies(pods))
    return found[0]


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def assistant_text(item: dict[str, Any]) -> str:
    assert item["type"] == "message" and item["role"] == "assistant", item
    return "".join(part["text"] for part in item["content"])


class Setup:
    def __init__(self, pods: list[RunningPod], gw: RunningGateway, sdk: openai.AsyncOpenAI):
        self.pods, self.gw, self.sdk = pods, gw, sdk


@pytest.fixture
async def make(start_pod: PodFactory, start_gateway: GatewayFactory) -> AsyncIterator[Any]:
    sdks: list[openai.AsyncOpenAI] = []

    async def go(store_config: dict[str, Any] | None = None) -> Setup:
        pods = [await start_pod(), await start_pod()]
        gw = await start_gateway(make_config(pods, store_epp(store_config)))
        sdk = sdk_for(gw)
        sdks.append(sdk)
        return Setup(pods, gw, sdk)

    yield go
    for sdk in sdks:
        await sdk.close()


async def test_three_turns_each_forwarded_self_contained(make: Any) -> None:
    s = await make()
    r1 = await s.sdk.responses.create(
        model=MODEL, input="My name is Ada.", instructions="Be brief.", max_output_tokens=3
    )
    r2 = await s.sdk.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=r1.id, max_output_tokens=4
    )
    r3 = await s.sdk.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "Say it again."}],
        previous_response_id=r2.id,
        instructions="Be verbose.",
        max_output_tokens=2,
    )
    assert r3.status == "completed" and r3.output_text

    bodies = responses_bodies(s.pods)
    assert len(bodies) == 3
    assert all("previous_response_id" not in b for b in bodies)

    first = body_ending_with(s.pods, "My name is Ada.")
    assert first["input"] == "My name is Ada."  # nothing to expand: forwarded as sent
    assert first["instructions"] == "Be brief."

    second = body_ending_with(s.pods, "What is my name?")
    assert second["input"][0] == user("My name is Ada.")
    assert assistant_text(second["input"][1]) == r1.output_text
    assert second["input"][2] == user("What is my name?")
    assert len(second["input"]) == 3
    assert "instructions" not in second  # the previous response's are not carried over

    third = body_ending_with(s.pods, "Say it again.")
    assert third["input"][:3] == second["input"]
    assert assistant_text(third["input"][3]) == r2.output_text
    assert third["input"][4] == {"role": "user", "content": "Say it again."}
    assert third["instructions"] == "Be verbose."
    assert third["max_output_tokens"] == 2

    got = await s.sdk.responses.retrieve(r3.id)
    assert got.previous_response_id == r2.id
    assert got.output_text == r3.output_text


async def test_streamed_turn_is_stored_and_continued(make: Any) -> None:
    s = await make()
    stream = await s.sdk.responses.create(
        model=MODEL, input="Tell me a story.", max_output_tokens=4, stream=True
    )
    final = None
    async for event in stream:
        if event.type == "response.completed":
            final = event.response
    assert final is not None and final.output_text

    # continued at once (read-your-writes), itself streamed
    stream2 = await s.sdk.responses.create(
        model=MODEL, input="Go on.", previous_response_id=final.id, stream=True
    )
    final2 = None
    async for event in stream2:
        if event.type == "response.completed":
            final2 = event.response
    assert final2 is not None

    body = body_ending_with(s.pods, "Go on.")
    assert "previous_response_id" not in body
    assert body["input"][0] == user("Tell me a story.")
    assert assistant_text(body["input"][1]) == final.output_text

    got = await s.sdk.responses.retrieve(final2.id)
    assert got.output_text == final2.output_text
    assert got.previous_response_id == final.id
    items = await s.sdk.responses.input_items.list(final2.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "message"]


async def test_get_delete_and_input_items(make: Any) -> None:
    s = await make()
    r1 = await s.sdk.responses.create(model=MODEL, input="one", max_output_tokens=2)
    r2 = await s.sdk.responses.create(
        model=MODEL, input="two", previous_response_id=r1.id, max_output_tokens=2
    )

    got = await s.sdk.responses.retrieve(r2.id)
    assert got.id == r2.id and got.object == "response"
    assert got.output_text == r2.output_text

    asc = await s.sdk.responses.input_items.list(r2.id, order="asc")
    assert [(i.role, i.content[0].text) for i in asc.data] == [  # type: ignore[union-attr]
        ("user", "one"),
        ("assistant", r1.output_text),
        ("user", "two"),
    ]
    assert asc.data[0].content[0].type == "input_text"  # type: ignore[union-attr]
    ids = [i.id for i in asc.data]
    assert len(set(ids)) == 3
    assert ids[1] == r1.output[0].id  # an output item keeps its own id
    # the same item has the same id in every response of the conversation
    first = await s.sdk.responses.input_items.list(r1.id)
    assert [i.id for i in first.data] == ids[:1]

    # the default order is newest first; pages follow `after`
    page = await s.sdk.responses.input_items.list(r2.id, limit=2)
    assert [i.id for i in page.data] == ids[::-1][:2]
    assert page.has_more is True and page.first_id == ids[2] and page.last_id == ids[1]
    every = [i.id async for i in s.sdk.responses.input_items.list(r2.id, limit=1)]
    assert every == ids[::-1]

    async with aiohttp.ClientSession() as http:
        async with http.delete(f"{s.gw.url}/v1/responses/{r2.id}") as resp:
            assert resp.status == 200
            assert await resp.json() == {"id": r2.id, "object": "response", "deleted": True}
        async with http.delete(f"{s.gw.url}/v1/responses/{r2.id}") as resp:
            assert resp.status == 404
        async with http.get(f"{s.gw.url}/v1/responses/{r1.id}/input_items?limit=0") as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "limit"
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.retrieve(r2.id)
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.input_items.list(r2.id)
    # deleting a later turn leaves the earlier one untouched
    assert (await s.sdk.responses.retrieve(r1.id)).output_text == r1.output_text


async def test_unknown_ids_are_404(make: Any) -> None:
    s = await make()
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.retrieve("resp_nope")
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.input_items.list("resp_nope")
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.delete("resp_nope")
    with pytest.raises(openai.NotFoundError) as info:
        await s.sdk.responses.create(model=MODEL, input="hi", previous_response_id="resp_nope")
    assert info.value.code == "previous_response_not_found"
    assert info.value.param == "previous_response_id"  # type: ignore[attr-defined]
    assert responses_bodies(s.pods) == []  # answered by the gateway, no pod asked


async def test_routes_404_without_a_store_plugin(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod()]
    gw = await start_gateway(make_config(pods))
    async with aiohttp.ClientSession() as http:
        for method, path in (
            ("GET", "/v1/responses/resp_x"),
            ("DELETE", "/v1/responses/resp_x"),
            ("GET", "/v1/responses/resp_x/input_items"),
        ):
            async with http.request(method, f"{gw.url}{path}") as resp:
                assert resp.status == 404, path
                error = (await resp.json())["error"]
                assert error["type"] == "invalid_request_error"
                assert "No responses store is configured" in error["message"]


async def test_store_without_its_feature_gate_is_skipped(
    start_pod: PodFactory, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    pods = [await start_pod()]
    epp = store_epp()
    epp["featureGates"] = []
    with caplog.at_level(logging.WARNING):
        gw = await start_gateway(make_config(pods, epp))
    assert "needs feature gate 'prepareDataPlugins'" in caplog.text
    assert gw.gateway.plugins.responses_store is None


@pytest.mark.slow
async def test_max_entries_evicts_least_recently_used(make: Any) -> None:
    s = await make({"inMemoryConfig": {"maxEntries": 2}})
    r1 = await s.sdk.responses.create(model=MODEL, input="a", max_output_tokens=1)
    r2 = await s.sdk.responses.create(model=MODEL, input="b", max_output_tokens=1)
    await s.sdk.responses.retrieve(r1.id)  # r1 is now the most recently used
    r3 = await s.sdk.responses.create(model=MODEL, input="c", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.retrieve(r2.id)
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.create(model=MODEL, input="d", previous_response_id=r2.id)
    assert (await s.sdk.responses.retrieve(r1.id)).id == r1.id
    assert (await s.sdk.responses.retrieve(r3.id)).id == r3.id


@pytest.mark.slow
async def test_ttl_expires_entries(make: Any) -> None:
    s = await make({"inMemoryConfig": {"ttl": "300ms"}})
    r1 = await s.sdk.responses.create(model=MODEL, input="a", max_output_tokens=1)
    assert (await s.sdk.responses.retrieve(r1.id)).id == r1.id
    await asyncio.sleep(0.4)
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.retrieve(r1.id)
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.create(model=MODEL, input="b", previous_response_id=r1.id)


async def test_store_false_is_not_stored(make: Any) -> None:
    s = await make()
    r1 = await s.sdk.responses.create(model=MODEL, input="a", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.retrieve(r1.id)
    # a continuation that asks not to be stored is still expanded, and not stored
    r2 = await s.sdk.responses.create(model=MODEL, input="b", max_output_tokens=1)
    r3 = await s.sdk.responses.create(
        model=MODEL, input="c", previous_response_id=r2.id, store=False, max_output_tokens=1
    )
    assert len(body_ending_with(s.pods, "c")["input"]) == 3
    with pytest.raises(openai.NotFoundError):
        await s.sdk.responses.retrieve(r3.id)


async def test_oversize_entry_is_not_stored_but_delivered_and_says_so(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    s = await make({"inMemoryConfig": {"maxEntryBytes": 300}})
    with caplog.at_level(logging.WARNING, "heimdall_proxy.plugins.responses_store"):
        raw = await s.sdk.responses.with_raw_response.create(
            model=MODEL, input="hi", max_output_tokens=3
        )
        stream = await s.sdk.responses.create(
            model=MODEL, input="hi", max_output_tokens=3, stream=True
        )
        events = [e async for e in stream]
    r1 = raw.parse()
    assert r1.output_text == "the gateway routes"
    assert raw.headers.get("x-heimdall-store") == "too-large"
    assert events[-1].type == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "the gateway routes"
    assert final.model_extra is not None and final.model_extra.get("store") is False
    for rid in (r1.id, final.id):
        with pytest.raises(openai.NotFoundError):
            await s.sdk.responses.retrieve(rid)
    warnings = [r.getMessage() for r in caplog.records if "not stored" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "over maxEntryBytes (300)" in warnings[0]


async def test_stored_answers_carry_no_store_signal(make: Any) -> None:
    s = await make()
    raw = await s.sdk.responses.with_raw_response.create(model=MODEL, input="hi")
    assert "x-heimdall-store" not in raw.headers
    stream = await s.sdk.responses.create(model=MODEL, input="hi", stream=True)
    events = [e async for e in stream]
    final = events[-1].response  # type: ignore[union-attr]
    assert "store" not in (final.model_extra or {})  # relayed as the pod sent it
    assert (await s.sdk.responses.retrieve(final.id)).id == final.id


async def test_a_conversation_whose_first_turn_is_gone_is_404(make: Any) -> None:
    s = await make()
    r1 = await s.sdk.responses.create(model=MODEL, input="one", max_output_tokens=1)
    r2 = await s.sdk.responses.create(
        model=MODEL, input="two", previous_response_id=r1.id, max_output_tokens=1
    )
    await s.sdk.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError) as info:
        await s.sdk.responses.create(model=MODEL, input="three", previous_response_id=r2.id)
    assert info.value.code == "previous_response_not_found"
    assert r1.id in info.value.message
    with pytest.raises(openai.NotFoundError) as listed:
        await s.sdk.responses.input_items.list(r2.id)
    assert r1.id in listed.value.message
    assert (await s.sdk.responses.retrieve(r2.id)).id == r2.id
    assert len(responses_bodies(s.pods)) == 2  # the broken turn reached no pod


# ---- the Redis tier -----------------------------------------------------------------------

REDIS_URL = "redis://127.0.0.1:6379"


@pytest.fixture
async def redis_client() -> AsyncIterator[Any]:
    from redis.asyncio import Redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    client = Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except (RedisConnectionError, OSError):
        await client.aclose()
        pytest.skip(f"no Redis at {REDIS_URL}")
    yield client
    await client.aclose()


async def test_conversation_survives_a_gateway_restart_on_redis(
    start_pod: PodFactory, start_gateway: GatewayFactory, redis_client: Any
) -> None:
    pods = [await start_pod(), await start_pod()]
    config = make_config(
        pods, store_epp({"tieredConfig": {"redis": {"address": REDIS_URL, "ttl": "1m"}}})
    )
    ids: list[str] = []
    try:
        gw1 = await start_gateway(config)
        sdk1 = sdk_for(gw1)
        r1 = await sdk1.responses.create(model=MODEL, input="remember me", max_output_tokens=2)
        ids.append(r1.id)
        await sdk1.close()
        await gw1.server.close()  # the first gateway is gone (its memory with it)

        gw2 = await start_gateway(config)
        sdk2 = sdk_for(gw2)
        r2 = await sdk2.responses.create(
            model=MODEL, input="who am I?", previous_response_id=r1.id, max_output_tokens=2
        )
        ids.append(r2.id)
        body = body_ending_with(pods, "who am I?")
        assert body["input"][0] == user("remember me")
        assert assistant_text(body["input"][1]) == r1.output_text
        assert (await sdk2.responses.retrieve(r1.id)).output_text == r1.output_text
        ttl = await redis_client.ttl(f"heimdall:responses:{r2.id}")
        assert 0 < ttl <= 60
        await sdk2.close()
    finally:
        for rid in ids:
            await redis_client.delete(f"heimdall:responses:{rid}")


async def test_redis_store_unreachable_fails_writes_visibly_and_continuations_503(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # nothing listens on this port; a plain request still goes through (the store only
    # fails when asked), a continuation cannot be served faithfully and is refused
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pods = [await start_pod()]
    redis = {"address": f"redis://127.0.0.1:{port}"}
    gw = await start_gateway(make_config(pods, store_epp({"tieredConfig": {"redis": redis}})))
    sdk = sdk_for(gw)
    try:
        raw = await sdk.responses.with_raw_response.create(
            model=MODEL, input="hi", max_output_tokens=1
        )
        r1 = raw.parse()
        assert r1.status == "completed"
        # the answer is delivered, and says it was not stored; the failure is counted
        assert raw.headers.get("x-heimdall-store") == "failed"
        failures = gw.metric(
            "heimdall_responses_store_write_failures_total", {"plugin": "responses-store"}
        )
        assert failures == 1
        with pytest.raises(openai.InternalServerError) as info:
            await sdk.responses.create(model=MODEL, input="x", previous_response_id=r1.id)
        assert info.value.status_code == 503
        assert info.value.code == "store_unavailable"  # type: ignore[attr-defined]
    finally:
        await sdk.close()
