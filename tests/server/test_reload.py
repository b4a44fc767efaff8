"""Config hot reload with a real gateway process and real simulated pods: SIGHUP while
streams are running, a pod removed and another added, a bad config rejected, the file watch."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.conftest import PodFactory, RunningPod
from tests.helpers import free_port, wait_http

STREAM = {"model": "sim-model", "prompt": "tell me a long story", "stream": True}


def write_config(
    path: Path, pods: list[RunningPod], plugins: list[dict[str, Any]] | None = None
) -> None:
    doc: dict[str, Any] = {"endpoints": [{"name": p.name, "url": p.url} for p in pods]}
    if plugins is not None:
        doc["plugins"] = plugins
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)  # as an editor or a ConfigMap update does: never a half-written file


class Gateway:
    def __init__(self, proc: asyncio.subprocess.Process, base: str, log: Path) -> None:
        self.proc, self.base, self.log = proc, base, log

    def logged(self, text: str) -> bool:
        return text in self.log.read_text()

    async def wait_logged(self, text: str, within: float = 10.0) -> None:
        for _ in range(int(within / 0.05)):
            if self.logged(text):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{text!r} never logged:\n{self.log.read_text()[-3000:]}")

    async def pods(self, http: aiohttp.ClientSession) -> int:
        async with http.get(self.base + "/ready") as r:
            return int((await r.json())["pods"])

    async def served_by(self, http: aiohttp.ClientSession) -> str:
        body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
        async with http.post(self.base + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            return r.headers["x-sim-pod"]


async def _gateway(cfg: Path, tmp_path: Path, *extra: str) -> AsyncIterator[Gateway]:
    port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "heimdall_proxy", "serve", "--config", str(cfg),
            "--host", "127.0.0.1", "--port", str(port), "--log-format", "text",
            "--metrics-interval", "50ms", *extra, stderr=sink,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_http(base + "/health")
        yield Gateway(proc, base, log)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)


@pytest.fixture
async def pods(start_pod: PodFactory) -> list[RunningPod]:
    # real speed (time_scale 1): a stream of 150 tokens takes about a second and a half
    return [await start_pod(name=f"p{i}", time_scale=1.0) for i in range(2)]


async def _stream(
    http: aiohttp.ClientSession, base: str, started: asyncio.Event
) -> tuple[int, str | None, int, bool]:
    async with http.post(base + "/v1/completions", json={**STREAM, "max_tokens": 150}) as r:
        status, pod = r.status, r.headers.get("x-sim-pod")
        chunks, done = 0, False
        async for line in r.content:
            if line.startswith(b"data: {"):
                chunks += 1
                started.set()
            done = done or line.strip() == b"data: [DONE]"
        return status, pod, chunks, done


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_sighup_swaps_endpoints_and_plugins_without_dropping_streams(
    tmp_path: Path, pods: list[RunningPod]
) -> None:
    a, b = pods
    cfg = tmp_path / "gw.yaml"
    write_config(cfg, [a])
    async for gw in _gateway(cfg, tmp_path):
        async with aiohttp.ClientSession() as http:
            assert await gw.served_by(http) == "p0"
            # streams in flight on p0 when the config that removes p0 arrives
            events = [asyncio.Event() for _ in range(6)]
            streams = [asyncio.create_task(_stream(http, gw.base, e)) for e in events]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 20)
            write_config(cfg, [b], plugins=[{"type": "queue-scorer"}])
            gw.proc.send_signal(signal.SIGHUP)
            await gw.wait_logged("config reloaded")
            # new requests go to the added pod while the old ones still stream from p0
            assert not all(s.done() for s in streams), "the streams ended before the reload"
            assert {await gw.served_by(http) for _ in range(5)} == {"p1"}
            for status, pod, chunks, done in await asyncio.gather(*streams):
                assert (status, pod, chunks, done) == (200, "p0", 150, True)  # finished, whole
            assert await gw.pods(http) == 1

            # a pod added beside it
            write_config(cfg, [a, b])
            gw.proc.send_signal(signal.SIGHUP)
            for _ in range(200):
                if await gw.pods(http) == 2:
                    break
                await asyncio.sleep(0.05)
            assert await gw.pods(http) == 2

            # a bad config: rejected with the reason, the config in force keeps serving
            cfg.write_text("plugins:\n- type: no-such-scorer\nendpoints:\n- name: x\n  url: bad\n")
            gw.proc.send_signal(signal.SIGHUP)
            await gw.wait_logged("config reload rejected")
            assert gw.logged("url must be http(s)://host[:port]")
            assert await gw.pods(http) == 2
            assert {await gw.served_by(http) for _ in range(10)} <= {"p0", "p1"}
            assert gw.proc.returncode is None

            # no endpoints (a templating mistake): rejected too, never an empty pool
            cfg.write_text("endpoints: []\n")
            gw.proc.send_signal(signal.SIGHUP)
            await gw.wait_logged("no endpoints and no discovery")
            assert await gw.pods(http) == 2
            assert {await gw.served_by(http) for _ in range(10)} <= {"p0", "p1"}
            assert not gw.logged("Traceback"), gw.log.read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_watch_config_reloads_on_file_change(tmp_path: Path, pods: list[RunningPod]) -> None:
    a, b = pods
    cfg = tmp_path / "gw.yaml"
    write_config(cfg, [a])
    async for gw in _gateway(cfg, tmp_path, "--watch-config", "100ms"):
        async with aiohttp.ClientSession() as http:
            assert await gw.served_by(http) == "p0"
            write_config(cfg, [b])  # no signal: the watch sees the file change
            await gw.wait_logged("config reloaded")
            assert {await gw.served_by(http) for _ in range(5)} == {"p1"}
            # an unknown plugin type is rejected and named
            write_config(cfg, [a], plugins=[{"type": "no-such-scorer"}])
            await gw.wait_logged("config reload rejected")
            assert gw.logged("no-such-scorer")
            assert await gw.served_by(http) == "p1"
