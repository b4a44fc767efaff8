"""Approximate prefix-cache routing through the gateway, on simulated pods."""

from __future__ import annotations

from collections import Counter
from typing import Any

import aiohttp

from tests.conftest import GatewayFactory, PodFactory, RunningGateway, make_config

PREFIX_EPP: dict[str, Any] = {
    "plugins": [
        {"type": "prefix-cache-scorer"},
        {"type": "no-hit-lru-scorer"},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "no-hit-lru-scorer", "weight": 2},
                {"pluginRef": "queue-scorer", "weight": 1},
            ],
        }
    ],
}


def long_prompt(topic: str) -> str:
    return f"Document about {topic}. " + " ".join(f"{topic}-{i}" for i in range(300))


async def send(http: aiohttp.ClientSession, gw: RunningGateway, body: dict[str, Any]) -> str:
    """Send one request once the gateway has seen every pod idle: the routing asserted here
    is prefix-cache-scorer's and no-hit-lru-scorer's, and queue-scorer (weight 1) reading a
    scrape that caught the previous request in a pod's queue ties a cold request's
    least-recently-used pod with the next one (no-hit-lru's ranks differ by 1/2 x weight 2),
    which the picker breaks at random."""
    await gw.settled()
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    async with http.post(
        f"{gw.url}{path}", json={"model": "sim-model", "max_tokens": 2, **body}
    ) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["x-sim-pod"]


async def test_a_repeated_prompt_returns_to_its_pod_and_cold_ones_rotate(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(3)]
    gw = await start_gateway(make_config(pods, PREFIX_EPP))
    async with aiohttp.ClientSession() as http:
        # Cold prompts (nothing shared): each goes to the pod that least recently got one.
        first = [await send(http, gw, {"prompt": long_prompt(f"t{i}")}) for i in range(6)]
        assert sorted(first[:3]) == sorted(p.name for p in pods)
        assert first[3:] == first[:3]
        # A prompt seen before goes back to the pod that served it, again and again.
        for i in (4, 1, 5, 0):
            again = [
                await send(http, gw, {"prompt": long_prompt(f"t{i}") + f" q{k}"}) for k in range(3)
            ]
            assert again == [first[i]] * 3


async def test_a_chat_conversation_sticks_to_its_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(4)]
    gw = await start_gateway(make_config(pods, PREFIX_EPP))
    async with aiohttp.ClientSession() as http:
        seen: Counter[str] = Counter()
        for conv in range(4):
            messages: list[dict[str, str]] = [
                {"role": "system", "content": long_prompt(f"system-{conv}")}
            ]
            for turn in range(3):
                messages.append({"role": "user", "content": f"question {turn}"})
                pod = await send(http, gw, {"messages": messages})
                seen[f"{conv}:{pod}"] += 1
                messages.append({"role": "assistant", "content": "the gateway routes"})
        # each conversation on one pod, the four conversations on four pods
        assert len(seen) == 4 and set(seen.values()) == {3}
        assert len({key.split(":")[1] for key in seen}) == 4
