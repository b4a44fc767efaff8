"""llm-d-router's precise-path configs, in the shapes its deploy/config/ gives them
(tests/fixtures/llm_d/, pods added): check-config accepts each, and each serves requests with
the simulated pods as upstream, the token-producer rendering on a pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from heimdall_proxy.cli.main import main
from heimdall_proxy.config.gateway import parse_config
from tests.conftest import GatewayFactory, PodFactory

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "llm_d"
#: The precise path's configs (tests/config/test_llm_d_configs.py serves every fixture).
CONFIGS = [
    FIXTURES / f"{n}.yaml"
    for n in ("sim-epp-kvcache", "sim-epp-no-hit-lru", "sim-epp-tokenizer-vllm-http")
]
TEXTS = {p: p.read_text() for p in CONFIGS}
PRODUCER = "precise-prefix-cache-producer"


def test_the_shapes_are_there() -> None:
    assert {p.stem for p in CONFIGS} == {
        "sim-epp-kvcache", "sim-epp-no-hit-lru", "sim-epp-tokenizer-vllm-http",
    }  # fmt: skip


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_check_config_accepts_them(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "prefix-cache-scorer" in out and "decode-filter" in out
    if "hashSeed" in path.read_text():
        assert "tokenProcessorConfig.hashSeed" in err  # accepted, warned about


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
async def test_they_serve_requests(
    path: Path, start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(kv_events_port=-1) for _ in range(2)]
    doc: dict[str, Any] = yaml.safe_load(TEXTS[path])
    doc["endpoints"] = [
        {"name": p.name, "url": p.url, "kvEvents": p.pod.kv_events_endpoint} for p in pods
    ]
    tokenized = False
    for plugin in doc["plugins"]:
        params = plugin.get("parameters") or {}
        if plugin["type"] == "token-producer":
            params["vllm"]["url"] = pods[0].url  # the render sidecar: a pod here
            tokenized = True
        if "kvEventsConfig" in params:
            params["kvEventsConfig"]["zmqEndpoint"] = "tcp://127.0.0.1:*"  # no fixed port
    gw = await start_gateway(parse_config(doc, str(path)))
    producer = gw.gateway.plugins.plugins[PRODUCER]
    async with aiohttp.ClientSession() as http:
        for route, body in (
            ("completions", {"prompt": "some text prompt " * 20}),
            ("chat/completions", {"messages": [{"role": "user", "content": "hi " * 40}]}),
        ):
            body = {"model": "sim-model", "max_tokens": 1, **body}
            async with http.post(f"{gw.url}/v1/{route}", json=body) as r:
                assert r.status == 200, await r.text()
    # with a token-producer every request is looked up; without one the producer is a no-op
    assert producer.stats.lookups == (2 if tokenized else 0)  # type: ignore[attr-defined]
