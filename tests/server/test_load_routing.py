"""Load, affinity and context-length routing through the gateway, on simulated pods."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from typing import Any

import aiohttp
import pytest

from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.active_request import ActiveRequestScorer
from heimdall_proxy.plugins.scheduling.scorers.lora_affinity import LoraAffinityScorer
from heimdall_proxy.plugins.scheduling.scorers.outstanding_work import OutstandingWorkScorer
from heimdall_proxy.plugins.scheduling.scorers.session_affinity import encode_token
from tests.conftest import GatewayFactory, PodFactory, RunningGateway, eventually, make_config
from tests.plugins.helpers import req

CTX = "mif.moreh.io/context-length-range"
LONG = 100_000  # room for the 50,000-token overflow requests


def profile(
    *refs: tuple[str, float], plugins: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    declared = plugins or [{"type": name} for name, _ in refs]
    return {
        "plugins": declared,
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": n, "weight": w} for n, w in refs]}
        ],
    }


async def post(
    http: aiohttp.ClientSession, gw: RunningGateway, body: dict[str, Any], **headers: str
) -> aiohttp.ClientResponse:
    async with http.post(f"{gw.url}/v1/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        return r


async def test_load_aware_avoids_the_loaded_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(3)]
    pods[0].pod.metrics_override = {"waiting": 100}
    pods[1].pod.metrics_override = {"waiting": 3}
    gw = await start_gateway(make_config(pods, profile(("load-aware-scorer", 1))))
    await eventually(lambda: gw.gateway.pool.get(pods[0].name).metrics.waiting == 100)
    await eventually(lambda: gw.gateway.pool.get(pods[1].name).metrics.waiting == 3)
    async with aiohttp.ClientSession() as http:
        seen: Counter[str] = Counter()
        for _ in range(6):
            r = await post(http, gw, {"model": "sim-model", "prompt": "x"})
            seen[r.headers["x-sim-pod"]] += 1
    assert seen == {pods[2].name: 6}


@pytest.mark.parametrize("scorer", ["active-request-scorer", "outstanding-work-scorer"])
async def test_held_requests_spread_evenly(
    start_pod: PodFactory, start_gateway: GatewayFactory, scorer: str
) -> None:
    pods = [await start_pod() for _ in range(3)]
    hold = asyncio.Event()
    for p in pods:
        p.pod.hold = hold
    gw = await start_gateway(make_config(pods, profile((scorer, 1))))
    body = {"model": "sim-model", "prompt": "same size", "max_tokens": 8, "stream": True}
    async with aiohttp.ClientSession() as http:
        responses = []
        for _ in range(9):
            r = await http.post(f"{gw.url}/v1/completions", json=body)
            await r.content.readuntil(b"\n\n")  # the request is now in flight on its pod
            responses.append(r)
        placed = Counter(r.headers["x-sim-pod"] for r in responses)
        hold.set()
        for r in responses:
            await r.read()
            r.release()
    assert placed == {p.name: 3 for p in pods}


async def test_heavy_request_weighs_more_than_short_ones(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """Count-based scoring would send the next request to the pod holding one request; the
    work-aware scorer sees that request is heavy and prefers the pod with three short ones."""
    a, b = await start_pod(), await start_pod()
    hold = asyncio.Event()
    a.pod.hold = b.pod.hold = hold
    gw = await start_gateway(make_config([a, b], profile(("outstanding-work-scorer", 1))))
    heavy = {"model": "sim-model", "prompt": "w " * 8000, "max_tokens": 1000, "stream": True}
    short = {"model": "sim-model", "prompt": "hi", "max_tokens": 20, "stream": True}
    async with aiohttp.ClientSession() as http:
        held = []
        for body in (heavy, short, short, short):
            r = await http.post(f"{gw.url}/v1/completions", json=body)
            await r.content.readuntil(b"\n\n")
            held.append(r)
        pods_of = [r.headers["x-sim-pod"] for r in held]
        assert pods_of[1:] == [pods_of[1]] * 3  # the short ones avoided the heavy one's pod
        assert pods_of[1] != pods_of[0]
        async with http.post(f"{gw.url}/v1/completions", json={**short, "stream": False}) as r:
            assert r.headers["x-sim-pod"] == pods_of[1]
        hold.set()
        for r in held:
            await r.read()
            r.release()


async def test_session_sticks_survives_load_and_ignores_forged_tokens(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(3)]
    epp = profile(("session-affinity-scorer", 10), ("queue-scorer", 1))
    gw = await start_gateway(make_config(pods, epp))
    body = {"model": "sim-model", "prompt": "x"}
    async with aiohttp.ClientSession() as http:
        first = await post(http, gw, body)
        token = first.headers["x-session-token"]
        home = first.headers["x-sim-pod"]
        assert token == encode_token(home)
        by_name = {p.name: p for p in pods}
        by_name[home].pod.metrics_override = {"waiting": 50}
        await eventually(lambda: gw.gateway.pool.get(home).metrics.waiting == 50)
        for _ in range(5):
            r = await post(http, gw, body, **{"x-session-token": token})
            assert r.headers["x-sim-pod"] == home
            assert r.headers["x-session-token"] == token
        # forged tokens: not base64, an address, an unknown pod -> ignored, load decides
        for forged in ("%%%", encode_token("169.254.169.254:80"), encode_token("nope")):
            r = await post(http, gw, body, **{"x-session-token": forged})
            assert r.status == 200
            assert r.headers["x-sim-pod"] != home
            assert r.headers["x-session-token"] == encode_token(r.headers["x-sim-pod"])


SEED2_PODS = {"A": "0-2048", "B": "2048-8192", "C": None}


@pytest.mark.parametrize("filtering", [False, True])
async def test_context_length_scenarios(
    start_pod: PodFactory, start_gateway: GatewayFactory, filtering: bool
) -> None:
    pods = [
        await start_pod(name="A", labels={CTX: "0-2048"}, max_model_len=LONG),
        await start_pod(name="B", labels={CTX: "2048-8192"}, max_model_len=LONG),
        await start_pod(name="C", max_model_len=LONG),
    ]
    plugins = [{"type": "context-length-aware", "parameters": {"enableFiltering": filtering}}]
    gw = await start_gateway(
        make_config(pods, profile(("context-length-aware", 1), plugins=plugins))
    )
    async with aiohttp.ClientSession() as http:
        # 500 tokens: A (~0.81) beats C (0.2) and B (0.0); in filter mode B is removed
        r = await post(http, gw, {"model": "sim-model", "prompt": "x" * 2000, "max_tokens": 1})
        assert r.headers["x-sim-pod"] == "A"
        # 5000 tokens: B's range matches
        r = await post(http, gw, {"model": "sim-model", "prompt": "x" * 20000, "max_tokens": 1})
        assert r.headers["x-sim-pod"] == "B"
        # 50,000 tokens: overflow; score mode prefers B (larger max) over A, and C's 0.2 is
        # below both; filter mode leaves only the unlabelled C
        r = await post(http, gw, {"model": "sim-model", "prompt": "x" * 200_000, "max_tokens": 1})
        assert r.headers["x-sim-pod"] == ("C" if filtering else "B")


@pytest.mark.slow
async def test_context_length_overflow_prefers_larger_max(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [
        await start_pod(name="A", labels={CTX: "0-8192"}, max_model_len=LONG),
        await start_pod(name="B", labels={CTX: "0-32768"}, max_model_len=LONG),
    ]
    gw = await start_gateway(make_config(pods, profile(("context-length-aware", 1))))
    async with aiohttp.ClientSession() as http:
        r = await post(http, gw, {"model": "sim-model", "prompt": "x" * 200_000, "max_tokens": 1})
        assert r.headers["x-sim-pod"] == "B"


@pytest.mark.slow
async def test_thousand_requests_with_random_aborts_leave_no_count(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(2)]
    epp = profile(("active-request-scorer", 1), ("outstanding-work-scorer", 1))
    gw = await start_gateway(make_config(pods, epp))
    active = gw.gateway.plugins.plugins["active-request-scorer"]
    work = gw.gateway.plugins.plugins["outstanding-work-scorer"]
    assert isinstance(active, ActiveRequestScorer)
    assert isinstance(work, OutstandingWorkScorer)
    rng = random.Random(7)
    limit = asyncio.Semaphore(64)
    connector = aiohttp.TCPConnector(limit=0)

    async def one(http: aiohttp.ClientSession, i: int) -> None:
        body = {
            "model": "sim-model",
            "prompt": f"r{i}",
            "max_tokens": rng.randint(1, 12),
            "stream": rng.random() < 0.5,
        }
        async with limit:
            task = asyncio.ensure_future(post(http, gw, body))
            if rng.random() < 0.4:
                await asyncio.sleep(rng.random() * 0.004)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await task

    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(one(http, i) for i in range(1000)))
    await eventually(lambda: gw.running() == 0)
    await eventually(lambda: all(active.count(p.name) == 0 for p in pods))
    assert all(work.work(p.name) == 0.0 for p in pods)
    assert sum(p.pod.cancelled for p in pods) > 0  # some aborts really reached the pods


@pytest.mark.slow
async def test_adapter_holding_pod_wins(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # real-time pods, so a long request keeps its adapter running while the test looks
    opts = {"lora_modules": ["sql", "chat"], "max_loras": 1, "time_scale": 1.0}
    a, b = await start_pod(**opts), await start_pod(**opts)
    gw = await start_gateway(make_config([a, b], profile(("lora-affinity-scorer", 1))))
    pool = gw.gateway.pool
    async with aiohttp.ClientSession() as http:
        held = []
        for pod, adapter in ((a, "sql"), (b, "chat")):
            # pin each adapter to its pod by sending a long request straight to the pod
            body = {"model": adapter, "prompt": "x", "max_tokens": 5000, "stream": True}
            r = await http.post(f"{pod.url}/v1/completions", json=body)
            await r.content.readuntil(b"\n\n")
            held.append(r)
        await eventually(lambda: pool.get(a.name).metrics.lora_running == ("sql",))
        await eventually(lambda: pool.get(b.name).metrics.lora_running == ("chat",))
        for adapter, home in (("sql", a), ("chat", b), ("sql", a)):
            body = {"model": adapter, "prompt": "y", "max_tokens": 1}
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
                assert r.headers["x-sim-pod"] == home.name
        for r in held:
            r.close()


@pytest.mark.slow
async def test_a_base_model_request_scores_the_same_on_every_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # One pod holds its only adapter slot with a running adapter, the other has none loaded:
    # scored as an adapter, a base-model request preferred the second (0.8 against 0.0).
    # The refresher learns the pods' /v1/models cards, which name the base model (no parent).
    opts = {"lora_modules": ["sql"], "max_loras": 1, "time_scale": 1.0}
    a, b = await start_pod(**opts), await start_pod(**opts)
    gw = await start_gateway(make_config([a, b], profile(("lora-affinity-scorer", 1))))
    pool = gw.gateway.pool
    async with aiohttp.ClientSession() as http:
        body = {"model": "sql", "prompt": "x", "max_tokens": 5000, "stream": True}
        held = await http.post(f"{a.url}/v1/completions", json=body)
        await held.content.readuntil(b"\n\n")
        await eventually(lambda: pool.get(a.name).metrics.lora_running == ("sql",))
        await eventually(lambda: all(e.model_cards for e in pool.endpoints()))
        base = a.pod.options.model
        assert pool.get(a.name).model_cards[base].get("parent") is None
        scorer = LoraAffinityScorer("l", NoParams(), None)  # type: ignore[arg-type]
        endpoints = pool.endpoints()
        got = scorer.score(CycleState(), req(model=base), endpoints)
        assert got == {a.name: 0.8, b.name: 0.8}
        got = scorer.score(CycleState(), req(model="sql"), endpoints)
        assert got == {a.name: 1.0, b.name: 0.8}
        held.close()
