"""Restarts that remember: a gateway process killed with SIGKILL and started again still
routes a prompt to the pod that cached it, before that pod publishes anything new. With the
in-memory index the new process asks each pod's replay socket for what it still buffers;
with a Redis index nothing was lost (the catch-up is turned off there to show it). Real
simulated pods publish KV events over real ZMQ and serve replay; Redis is the real one."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from heimdall_proxy.plugins.scheduling.scorers.session_affinity import encode_token
from tests.conftest import PodFactory, RunningPod
from tests.helpers import free_port, wait_http
from tests.kvcache.redisns import REDIS_URL, redis_namespace
from tests.tokenization.model import make_model_dir

PROMPT = list(range(5000, 5000 + 16 * 8))  # 8 blocks of 16 token ids
COLD = list(range(9000, 9000 + 16 * 8))


def two_free_ports() -> int:
    """A port whose successor is free too (the simulator's replay ROUTER is PUB port + 1)."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def gateway_config(pods: list[RunningPod], model_dir: Path, index: dict[str, Any]) -> dict:
    params = {
        "tokenProcessorConfig": {"blockSize": 16},
        "indexerConfig": {
            "tokenizersPoolConfig": {"modelName": str(model_dir), "workersCount": 1},
            "kvBlockIndexConfig": {"enableMetrics": True, **index.get("kvBlockIndexConfig", {})},
        },
        "kvEventsConfig": {"concurrency": 2, **index.get("kvEventsConfig", {})},
    }
    return {
        "plugins": [
            {"type": "precise-prefix-cache-scorer", "parameters": params},
            {"type": "session-affinity-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "precise-prefix-cache-scorer", "weight": 1},
                    {"pluginRef": "session-affinity-scorer", "weight": 0.1},
                ],
            }
        ],
        "endpoints": [
            {"name": p.name, "url": p.url, "kvEvents": p.pod.kv_events_endpoint} for p in pods
        ],
    }


class GatewayProcess:
    def __init__(self, cfg: Path, log: Path) -> None:
        self.cfg, self.log = cfg, log
        self.proc: asyncio.subprocess.Process | None = None
        self.base = ""

    async def start(self) -> None:
        port = free_port()
        with self.log.open("ab") as sink:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "heimdall_proxy", "serve", "--config", str(self.cfg),
                "--host", "127.0.0.1", "--port", str(port), "--log-format", "text",
                stderr=sink,
            )  # fmt: skip
        self.base = f"http://127.0.0.1:{port}"
        await wait_http(self.base + "/ready", within=60)

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)  # no clean-up runs: whatever it held is gone
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 30)

    async def admissions(self, http: aiohttp.ClientSession) -> float:
        async with http.get(self.base + "/metrics") as r:
            text = await r.text()
        return sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "kvcache_index_admissions_total"
        )

    async def served_by(self, http: aiohttp.ClientSession, prompt: list[int], tie: str) -> str:
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
        headers = {"x-session-token": encode_token(tie)}
        async with http.post(self.base + "/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            return r.headers["x-sim-pod"]


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    async with redis_namespace() as prefix:
        yield prefix


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", ["memory", "redis"])
async def test_a_restarted_gateway_routes_to_what_the_pods_cached(
    index: str, start_pod: PodFactory, tmp_path: Path, redis_prefix: str
) -> None:
    pods = []
    for _ in range(2):
        port = two_free_ports()
        pods.append(await start_pod(kv_events_port=port, kv_events_replay_port=port + 1))
    settings: dict[str, Any] = {}
    if index == "redis":
        settings = {
            "kvBlockIndexConfig": {
                "redisConfig": {"address": REDIS_URL, "keyPrefix": redis_prefix}
            },
            "kvEventsConfig": {"catchUpOnStart": False},
        }
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump(gateway_config(pods, make_model_dir(tmp_path / "m"), settings)))
    log = tmp_path / "gateway.log"
    first, second = GatewayProcess(cfg, log), GatewayProcess(cfg, log)
    try:
        await first.start()
        async with aiohttp.ClientSession() as http:
            # pod-1 caches the prompt (sent to it directly); the first gateway hears of it
            body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 1}
            for attempt in range(20):
                if attempt:  # the SUB may have joined late: have pod-1 announce the blocks again
                    async with http.post(f"{pods[1].url}/reset_prefix_cache") as r:
                        assert r.status == 200
                async with http.post(f"{pods[1].url}/v1/completions", json=body) as r:
                    assert r.status == 200
                for _ in range(20):
                    if await first.admissions(http) >= 8:
                        break
                    await asyncio.sleep(0.05)
                else:
                    continue
                break
            assert await first.admissions(http) >= 8
            await first.kill()

            await second.start()
            # the first request after the restart: pod-1, although the tie goes to pod-0
            assert await second.served_by(http, PROMPT, tie=pods[0].name) == pods[1].name
            assert await second.served_by(http, COLD, tie=pods[0].name) == pods[0].name
        text = log.read_text()
        if index == "memory":
            assert "caught up" in text, text[-3000:]
        else:
            assert "caught up" not in text
    finally:
        await first.stop()
        await second.stop()
