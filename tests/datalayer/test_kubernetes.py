"""Kubernetes pod discovery against a recorded API server.

No cluster can run on this machine, so the API server is mocked: a small aiohttp app replays
Kubernetes API responses (fixtures/kubernetes_pods.json: a pod list, a watch stream with
ADDED / MODIFIED / DELETED / BOOKMARK events and readiness changes, then a 410 Expired that
forces a re-list) to the real kubernetes_asyncio client, over real HTTP. The pods behind it are
real simulated vLLM servers on 127.0.0.2-4 (one target port, as an InferencePool has)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from heimdall_proxy.config.discovery import KubernetesDiscoveryConfig
from heimdall_proxy.config.gateway import EndpointConfig, parse_config
from heimdall_proxy.datalayer.kubernetes import KubernetesPods
from heimdall_proxy.plugins.precise_prefix.scorer import PrecisePrefixCacheScorer
from heimdall_proxy.sim import SimOptions, SimPod
from tests.conftest import GatewayFactory, eventually
from tests.helpers import free_port
from tests.tokenization.model import make_model_dir

FIXTURE = Path(__file__).parent / "fixtures" / "kubernetes_pods.json"
IPS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


class RecordedApiServer:
    """Replays the fixture: list i answers the i-th list request (the last one repeats);
    a watch from a recorded resource version streams its events and ends; a watch from any
    other version stays open, silent, as an idle watch does."""

    def __init__(self) -> None:
        text = FIXTURE.read_text()
        for i, ip in enumerate(IPS):
            text = text.replace(f"{{ip{i}}}", ip)
        self.doc = json.loads(text)
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.lists = 0
        #: the first watch waits for this, so a test can look at the listed state first
        self.release = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_get("/api/v1/namespaces/{ns}/pods", self.pods)

    async def pods(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.path, dict(request.query)))
        if request.query.get("watch") not in ("true", "True", "1"):
            doc = self.doc["list"][min(self.lists, len(self.doc["list"]) - 1)]
            self.lists += 1
            return web.json_response(doc)
        version = request.query.get("resourceVersion", "")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        events = self.doc["watch"].get(version)
        if events is None:
            await asyncio.sleep(3600)
        await self.release.wait()
        for event in events:
            await resp.write(json.dumps(event).encode() + b"\n")
            await asyncio.sleep(0.01)
        return resp


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "recorded"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
async def api(aiohttp_server: Any, tmp_path: Path) -> tuple[RecordedApiServer, Path]:
    recorded = RecordedApiServer()
    server = await aiohttp_server(recorded.app)
    url = str(server.make_url("")).rstrip("/")
    return recorded, write_kubeconfig(tmp_path / "kubeconfig", url)


def discovery(kubeconfig: Path, port: int = 8000) -> dict[str, Any]:
    return {
        "namespace": "llm",
        "selector": {"app": "vllm"},
        "targetPort": port,
        "kubeconfig": str(kubeconfig),
        "retryDelay": "50ms",
    }


def names(snapshot: list[EndpointConfig]) -> list[str]:
    return [e.name for e in snapshot]


@pytest.mark.slow
async def test_list_watch_readiness_and_410_resync(api: tuple[RecordedApiServer, Path]) -> None:
    recorded, kubeconfig = api
    snapshots: list[list[EndpointConfig]] = []
    cfg = KubernetesDiscoveryConfig.model_validate(discovery(kubeconfig))
    pods = KubernetesPods(cfg, snapshots.append)
    await pods.start()
    try:
        # the first list: vllm-b is Running but not Ready
        assert [names(s) for s in snapshots] == [["vllm-a"]]
        a = snapshots[0][0]
        assert a.url == "http://127.0.0.2:8000"
        assert a.labels == {"app": "vllm", "mif.moreh.io/role": "decode"}
        recorded.release.set()
        await eventually(lambda: pods.lists == 2)
        await eventually(lambda: names(snapshots[-1]) == ["vllm-a", "vllm-e"])
        await eventually(lambda: sum("watch" in q for _, q in recorded.requests) == 3)
    finally:
        await pods.stop()
    assert [names(s) for s in snapshots] == [
        ["vllm-a"],
        ["vllm-a", "vllm-b"],  # b turned Ready
        # c (Pending, no IP) changed nothing; the bookmark neither
        ["vllm-a", "vllm-b", "vllm-d"],  # d added, Ready
        ["vllm-b", "vllm-d"],  # a no longer Ready
        ["vllm-b"],  # d terminating (deletionTimestamp); its DELETED changed nothing more
        ["vllm-a", "vllm-e"],  # 410 Expired: listed again, the list replaces everything
    ]
    assert snapshots[-1][1].labels["mif.moreh.io/role"] == "prefill"
    for path, query in recorded.requests:
        assert path == "/api/v1/namespaces/llm/pods"
        assert query["labelSelector"] == "app=vllm"
    watches = [q.get("resourceVersion") for _, q in recorded.requests if "watch" in q]
    assert watches[:3] == ["100", "107", "200"]  # resumed from the last event, then re-listed


@pytest.mark.slow
async def test_the_gateway_and_the_precise_scorer_follow_discovered_pods(
    api: tuple[RecordedApiServer, Path],
    aiohttp_server: Any,
    start_gateway: GatewayFactory,
    tmp_path: Path,
) -> None:
    recorded, kubeconfig = api
    port = free_port()
    for ip, name in zip(IPS, ("vllm-a", "vllm-b", "vllm-e"), strict=True):
        await aiohttp_server(
            SimPod(SimOptions(name=name, time_scale=0.01)).app(), host=ip, port=port
        )
    model_dir = make_model_dir(tmp_path / "tiny")
    doc = {
        "plugins": [
            {
                "type": "precise-prefix-cache-scorer",
                "parameters": {
                    "indexerConfig": {
                        "tokenizersPoolConfig": {"modelName": str(model_dir), "workersCount": 1}
                    },
                    "kvEventsConfig": {"podDiscoveryConfig": {"socketPort": 5599}},
                },
            },
        ],
        "discovery": {"kubernetes": discovery(kubeconfig, port)},
    }
    gw = await start_gateway(parse_config(doc, "<test>"))
    scorer = gw.gateway.plugins.plugins["precise-prefix-cache-scorer"]
    assert isinstance(scorer, PrecisePrefixCacheScorer) and scorer.ingest is not None
    subscriber = scorer.ingest.subscriber
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:

        async def served_by() -> str:
            async with http.post(gw.url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                return r.headers["x-sim-pod"]

        assert [e.name for e in gw.gateway.pool.endpoints()] == ["vllm-a"]
        assert await served_by() == "vllm-a"
        assert subscriber.subscriptions() == {"vllm-a": "tcp://127.0.0.2:5599"}

        recorded.release.set()
        await eventually(lambda: recorded.lists == 2)
        await eventually(
            lambda: {e.name for e in gw.gateway.pool.endpoints()} == {"vllm-a", "vllm-e"}
        )
        assert gw.gateway.pool.get("vllm-e").labels["mif.moreh.io/role"] == "prefill"  # type: ignore[union-attr]
        await eventually(
            lambda: (
                subscriber.subscriptions()
                == {"vllm-a": "tcp://127.0.0.2:5599", "vllm-e": "tcp://127.0.0.4:5599"}
            )
        )
        seen = {await served_by() for _ in range(12)}
        assert seen <= {"vllm-a", "vllm-e"}
        # the discovered pod is scraped like a static one
        await eventually(lambda: gw.gateway.pool.get("vllm-e").models is not None)  # type: ignore[union-attr]
