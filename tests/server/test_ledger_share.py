"""The in-flight ledger shared between gateway replicas once, by inflight-load-producer, on
the real Redis (127.0.0.1:6379) with simulated pods: a request in flight through one replica
counts on the other in every reader (the ledger's sums, token-load-scorer,
active-request-scorer), and a killed replica's counts expire."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from heimdall_proxy.plugins.scheduling.scorers.active_request import ActiveRequestScorer
from heimdall_proxy.plugins.scheduling.scorers.token_load import TokenLoadScorer
from heimdall_proxy.replicas.ledger import share_of
from tests.conftest import GatewayFactory, PodFactory, RunningGateway, eventually, make_config
from tests.helpers import ep
from tests.kvcache.redisns import REDIS_URL, redis_namespace
from tests.server.test_restart import GatewayProcess

BODY = {"model": "sim-model", "prompt": "tell me a story " * 40, "max_tokens": 200, "stream": True}


def epp(prefix: str, **producer: Any) -> dict[str, Any]:
    store = {"redisConfig": {"address": REDIS_URL, "keyPrefix": prefix}, "syncInterval": "10ms",
             "replicaTTL": "1s"}  # fmt: skip
    return {
        "plugins": [
            {"type": "inflight-load-producer", "parameters": {**store, **producer}},
            {"type": "token-load-scorer"},
            {"type": "active-request-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "token-load-scorer"},
                    {"pluginRef": "active-request-scorer"},
                ],
            }
        ],
    }


@pytest.fixture
async def ns() -> AsyncIterator[str]:
    async with redis_namespace() as prefix:
        yield prefix


def readers(gw: RunningGateway, pod: str) -> tuple[int, int, int, float]:
    """What replica `gw`'s readers see on `pod`: the ledger's requests and tokens, the
    active-request count, and the token-load score of the pod against an idle one."""
    plugins = gw.gateway.plugins.plugins
    active, tokens = plugins["active-request-scorer"], plugins["token-load-scorer"]
    assert isinstance(active, ActiveRequestScorer) and isinstance(tokens, TokenLoadScorer)
    load = gw.gateway.load
    scores = tokens.score(None, None, [ep(pod), ep("idle")])  # type: ignore[arg-type]
    return load.requests.get(pod, 0), load.tokens.get(pod, 0), active.count(pod), scores[pod]


@pytest.mark.slow
async def test_a_request_in_flight_through_one_replica_is_seen_by_the_others_scorers(
    start_pod: PodFactory, start_gateway: GatewayFactory, ns: str
) -> None:
    pod = await start_pod()
    pod.pod.hold = asyncio.Event()
    # the output estimate (max_tokens) counts until the end; the prompt's tokens would leave
    # at the first chunk, which the held stream has sent
    a = await start_gateway(make_config([pod], epp(ns, addEstimatedOutputTokens=True)))
    b = await start_gateway(make_config([pod], epp(ns, addEstimatedOutputTokens=True)))
    assert readers(b, pod.name)[:3] == (0, 0, 0)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{a.url}/v1/completions", json=BODY) as r:
            # counted with its prompt until a's first chunk, then with its output estimate
            await eventually(lambda: readers(b, pod.name)[1] == 200)
            requests, _, active, score = readers(b, pod.name)
            assert requests == 1 and active == 1 and score < 1.0
            # it is a's own, not b's: b's own count (and metrics) stay at zero
            assert b.gateway.load.own_requests.get(pod.name, 0) == 0
            assert a.gateway.load.own_requests[pod.name] == 1
            pod.pod.hold.set()
            await r.read()
    await eventually(lambda: readers(b, pod.name)[:3] == (0, 0, 0))


@pytest.mark.slow
async def test_a_killed_replicas_counts_expire_on_the_others(
    start_pod: PodFactory, start_gateway: GatewayFactory, ns: str, tmp_path: Path
) -> None:
    pod = await start_pod()
    pod.pod.hold = asyncio.Event()
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump({**epp(ns), "endpoints": [{"name": pod.name, "url": pod.url}]}))
    a = GatewayProcess(cfg, tmp_path / "a.log")
    await a.start()
    b = await start_gateway(make_config([pod], epp(ns)))
    try:
        async with aiohttp.ClientSession() as http:
            r = await http.post(f"{a.base}/v1/completions", json=BODY)
            await eventually(lambda: readers(b, pod.name)[0] == 1, within=10.0)
            await a.kill()  # no clean withdrawal: a's hash must expire (replicaTTL 1s)
            r.close()
            assert readers(b, pod.name)[0] == 1
            await eventually(lambda: readers(b, pod.name)[:3] == (0, 0, 0), within=10.0)
    finally:
        pod.pod.hold.set()
        await a.stop()


async def test_sync_cross_replica_state_false_keeps_the_ledger_local(
    start_pod: PodFactory, start_gateway: GatewayFactory, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    pod = await start_pod()
    with caplog.at_level(logging.WARNING):
        gw = await start_gateway(make_config([pod], epp(ns, syncCrossReplicaState=False)))
    assert share_of(gw.gateway.load).counters is None
    assert "syncCrossReplicaState is false" in caplog.text


@pytest.mark.slow
async def test_a_scorers_own_store_still_shares_the_ledger_and_is_deprecated(
    start_pod: PodFactory, start_gateway: GatewayFactory, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica upgraded with its old config (the store on active-request-scorer) keeps
    counting its peers, and is told where the parameters now go."""
    pod = await start_pod()
    pod.pod.hold = asyncio.Event()
    old_style = {"redisConfig": {"address": REDIS_URL, "keyPrefix": ns}, "syncInterval": "10ms"}
    doc = epp(ns)
    doc["plugins"] = [
        {"type": "token-load-scorer"},
        {"type": "active-request-scorer", "parameters": old_style},
        {"type": "max-score-picker"},
    ]
    with caplog.at_level(logging.WARNING):
        a = await start_gateway(make_config([pod], doc))
    assert "deprecated" in caplog.text and "inflight-load-producer" in caplog.text
    b = await start_gateway(make_config([pod], epp(ns)))  # the new style, same store
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{a.url}/v1/completions", json=BODY) as r:
            await eventually(lambda: readers(b, pod.name)[0] == 1)
            pod.pod.hold.set()
            await r.read()
    await eventually(lambda: readers(b, pod.name)[0] == 0)
