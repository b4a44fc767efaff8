"""Parsers through the gateway: `requestHandler.parsers` decides which APIs are served and
how; llm-d's default list serves OpenAI, Anthropic and vLLM's generate, with passthrough as
the fallback for allow-listed routes; and prefix-aware routing works on Messages traffic as
on chat."""

from __future__ import annotations

from collections import Counter
from typing import Any

import aiohttp

from tests.conftest import GatewayFactory, PodFactory, RunningGateway, make_config
from tests.server.test_prefix_routing import PREFIX_EPP, long_prompt

CHAT = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def epp_with(parsers: list[str], plugins: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "plugins": [*(plugins or [{"type": "max-score-picker"}]), *({"type": t} for t in parsers)],
        "requestHandler": {"parsers": [{"pluginRef": t} for t in parsers]},
    }


async def post(gw: RunningGateway, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}{path}", json=body) as r:
            return r.status, await r.json(content_type=None)


async def test_an_explicit_list_serves_only_its_apis(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod()]
    gw = await start_gateway(make_config(pods, epp_with(["anthropic-parser"])))
    status, doc = await post(gw, "/v1/messages", CHAT)
    assert status == 200 and doc["type"] == "message"
    status, doc = await post(gw, "/v1/chat/completions", CHAT)
    assert status == 404 and doc["error"]["code"] == "not_found"  # no parser claims it
    assert len(pods[0].pod.received) == 1


async def test_an_allowed_route_no_parser_claims_is_refused_without_a_fallback(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod()]
    config = make_config(pods, epp_with(["openai-parser"]))
    gw = await start_gateway(config, allow_routes=("/tokenize",))
    status, doc = await post(gw, "/tokenize", {"model": "sim-model", "prompt": "a b"})
    assert status == 400 and doc["error"]["code"] == "unsupported_path"
    assert not pods[0].pod.received
    # with the default list, passthrough-parser forwards it, uninterpreted
    gw = await start_gateway(make_config(pods), allow_routes=("/tokenize",))
    status, doc = await post(gw, "/tokenize", {"model": "sim-model", "prompt": "a b"})
    assert status == 200 and doc["tokens"]


async def test_a_messages_conversation_sticks_to_its_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """PREFIX_EPP's scorers, on Anthropic traffic: an agent's conversation, whose every turn
    repeats the last with a tool call and its result appended, stays on one pod; four
    conversations spread over four pods."""
    pods = [await start_pod() for _ in range(4)]
    gw = await start_gateway(make_config(pods, PREFIX_EPP))
    seen: Counter[str] = Counter()
    async with aiohttp.ClientSession() as http:
        for conv in range(4):
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {conv}"}]
            for turn in range(3):
                await gw.settled()
                body = {"model": "sim-model", "max_tokens": 2,
                        "system": long_prompt(f"agent-{conv}"), "messages": messages}  # fmt: skip
                async with http.post(f"{gw.url}/v1/messages", json=body) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                    seen[f"{conv}:{r.headers['x-sim-pod']}"] += 1
                call = {"type": "tool_use", "id": f"t{turn}", "name": "read", "input": {"n": turn}}
                result = {"type": "tool_result", "tool_use_id": f"t{turn}",
                          "content": long_prompt(f"file-{conv}-{turn}")}  # fmt: skip
                messages += [
                    {"role": "assistant", "content": [call]},
                    {"role": "user", "content": [result]},
                ]
    assert len(seen) == 4 and set(seen.values()) == {3}
    assert len({key.split(":")[1] for key in seen}) == 4
