"""llm-d-router's configs that use the scheduling plugins of issue 35 (tests/fixtures/llm_d,
pods added): check-config accepts each, and each serves requests with simulated pods as its
endpoints, doing what the config is for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from heimdall_proxy.cli.main import main
from heimdall_proxy.config.gateway import parse_config
from tests.conftest import GatewayFactory, PodFactory, RunningPod

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm_d"
DP = FIXTURES / "dp-epp-config.yaml"
TOPOLOGY = FIXTURES / "pd-topology-epp-config.yaml"
HOST = "kubernetes.io/hostname"
ROLE = "llm-d.ai/role"


@pytest.mark.parametrize(
    ("path", "types"),
    [
        (DP, ["data-parallel-profile-handler"]),
        (TOPOLOGY, ["topology-extractor", "topology-affinity-filter", "topology-affinity-scorer"]),
    ],
    ids=["dp-epp-config", "pd-topology-epp-config"],
)
def test_check_config_accepts_them(
    path: Path, types: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert all(f"(type {t})" in out for t in types)


def on_pods(path: Path, pods: list[RunningPod]) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["endpoints"] = [{"name": p.name, "url": p.url, "labels": p.labels} for p in pods]
    return doc


def hostport(pod: RunningPod) -> str:
    return pod.url.removeprefix("http://")


async def chat(http: aiohttp.ClientSession, url: str, text: str) -> str:
    body = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    async with http.post(f"{url}/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return r.headers["x-sim-pod"]


@pytest.mark.slow
async def test_data_parallel_sends_to_the_primary_port_naming_the_rank(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    ranks = [await start_pod(), await start_pod()]
    doc = on_pods(DP, ranks)
    primary = ranks[0]
    # the ranks of one server share a host; here the first rank's port is the primary one
    doc["plugins"][3]["parameters"]["primaryPort"] = int(primary.url.rsplit(":", 1)[1])
    gw = await start_gateway(parse_config(doc, str(DP)))
    async with aiohttp.ClientSession() as http:
        for i in range(6):
            assert await chat(http, gw.url, f"question {i} " * 30) == primary.name
    named = [
        r.headers.get("x-data-parallel-host-port")
        for r in primary.pod.received
        if r.path.endswith("/chat/completions")
    ]
    assert len(named) == 6 and set(named) <= {hostport(p) for p in ranks}
    assert not [r for r in ranks[1].pod.received if r.path.endswith("/chat/completions")]


@pytest.mark.slow
async def test_pd_topology_picks_the_prefill_pod_on_the_decode_pods_host(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    decode = await start_pod(labels={ROLE: "decode", HOST: "node-a"})
    far = await start_pod(labels={ROLE: "prefill", HOST: "node-b"})
    near = await start_pod(labels={ROLE: "prefill", HOST: "node-a"})
    gw = await start_gateway(parse_config(on_pods(TOPOLOGY, [decode, far, near]), str(TOPOLOGY)))
    async with aiohttp.ClientSession() as http:
        for i in range(4):
            assert await chat(http, gw.url, f"a long uncached prompt {i} " * 40) == decode.name
    # no disagg-headers-handler: the decode pod's sidecar is told the prefill pod (llm-d's way)
    told = [
        r.headers.get("x-prefiller-host-port")
        for r in decode.pod.received
        if r.path.endswith("/chat/completions")
    ]
    assert told == [hostport(near)] * 4
