"""The seeds' own example configs load as printed (seed 001's load-aware example, seed
002's PD example with its legacy pd-profile-handler and no decider declared) and serve
requests on simulated pods."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
import yaml

from heimdall_proxy.cli.main import main
from heimdall_proxy.config.gateway import parse_config
from tests.conftest import GatewayFactory, PodFactory

SEEDS = Path(__file__).resolve().parents[1] / "fixtures" / "seeds"
CONFIGS = sorted(SEEDS.glob("*.yaml"))
TEXTS = {p: p.read_text() for p in CONFIGS}


def test_both_examples_are_there() -> None:
    assert [p.stem for p in CONFIGS] == ["seed-001-load-aware", "seed-002-pd"]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_check_config_accepts_each(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    if "pd" in path.stem:  # the decider the handler names, with its defaults
        assert "prefix-based-pd-decider (type prefix-based-pd-decider)" in out


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
async def test_each_serves_requests(
    path: Path, start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    doc = yaml.safe_load(TEXTS[path])
    pods = []
    for ep in doc["endpoints"]:
        pods.append(await start_pod(name=ep["name"], labels=ep.get("labels", {})))
    doc["endpoints"] = [{"name": p.name, "url": p.url, "labels": p.labels} for p in pods]
    gw = await start_gateway(parse_config(doc, str(path)))
    body = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            # the PD example's decider keeps its default (no prefill): decode serves it
            assert r.headers["x-sim-pod"] in {"vllm-0", "decode-0"}
