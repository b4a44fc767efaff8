"""llm-d-router's EndpointPickerConfigs as its users write them (tests/fixtures/llm_d: the
same types and parameters as the files each header names, pods added): each passes
check-config, and each serves requests with simulated pods in place of the cluster's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from heimdall_proxy.cli.main import main
from heimdall_proxy.config.gateway import parse_config
from tests.conftest import GatewayFactory, PodFactory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llm_d"
CONFIGS = sorted(FIXTURES.glob("*.yaml"))
TEXTS = {p: p.read_text() for p in CONFIGS}
#: The pods' llm-d roles: the role filters of the P/D and E/P/D configs find a pod each.
ROLES = ("decode", "prefill", "encode")


def test_the_configs_are_there() -> None:
    assert {p.stem for p in CONFIGS} >= {
        "default-config", "epp-config", "epp-estimate-prefix-cache-config",
        "optimized-baseline", "pd-epp-config", "random-only-default-parsers",
        "random-passthrough-parser", "sim-e-p-d-epp-config", "sim-e-pd-epp-config", "precise-prefix",
        "dp-epp-config", "pd-topology-epp-config", "probabilistic-admitter-epp-config",
        "sim-program-aware-config", "soft-reflective-ceiling-epp-config", "sim-epp-gpu-config",
        "epp-burst-prefix-cache-config", "epp-mm-embeddings-cache-config",
        "epp-precise-prefix-cache-config", "datalayer-config", "request-attribute-reporter-config",
        "sim-epp-config", "sim-epp-kvcache", "sim-epp-no-hit-lru",
        "sim-epp-tokenizer-vllm-http", "sim-pd-epp-config",
    }  # fmt: skip


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_check_config_accepts_each(path: Path) -> None:
    assert main(["check-config", str(path)]) == 0


def _epp(doc: dict[str, Any]) -> dict[str, Any]:
    """The EndpointPickerConfig of a file, inside llm-d's Helm values when it is one."""
    if "router" not in doc:
        return doc
    epp = doc["router"]["epp"]
    text = epp["pluginsCustomConfig"][epp["pluginsConfigFile"]]
    return yaml.safe_load(text) if isinstance(text, str) else dict(text)


def _on_pods(doc: dict[str, Any], pods: list[Any]) -> dict[str, Any]:
    """`doc` with the simulated pods as its endpoints and its sidecars on them."""
    epp = _epp(doc)
    for plugin in epp.get("plugins", []):
        params = plugin.get("parameters") or {}
        if plugin["type"] == "token-producer" and "vllm" in params:
            params["vllm"]["url"] = pods[0].url  # the render sidecar: a pod here
        if "kvEventsConfig" in params:
            params["kvEventsConfig"]["zmqEndpoint"] = "tcp://127.0.0.1:*"  # no fixed port
        if plugin["type"] == "data-parallel-profile-handler":
            # every rank is reached on the server's primary port: the first pod's here
            plugin["parameters"] = {**params, "primaryPort": int(pods[0].url.rsplit(":", 1)[1])}
    epp["endpoints"] = [
        {"name": p.name, "url": p.url, "labels": p.labels, "kvEvents": p.pod.kv_events_endpoint}
        for p in pods
    ]
    return epp


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
async def test_each_serves_requests(
    path: Path, start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(kv_events_port=-1, labels={"llm-d.ai/role": r}) for r in ROLES]
    gw = await start_gateway(parse_config(_on_pods(yaml.safe_load(TEXTS[path]), pods)))
    served = 0
    async with aiohttp.ClientSession() as http:
        for route, body in (
            ("/v1/completions", {"prompt": "some text prompt " * 40}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi " * 80}]}),
            ("/v1/messages", {"messages": [{"role": "user", "content": "hi " * 80}]}),
        ):
            body = {"model": "sim-model", "max_tokens": 2, **body}
            claimed = gw.gateway.plugins.parsers.claimed(route) is not None
            async with http.post(f"{gw.url}{route}", json=body) as r:
                # the routes its parsers serve are served; the others are not routes at all
                assert r.status == (200 if claimed else 404), (route, await r.text())
                served += claimed
    assert served >= 2
