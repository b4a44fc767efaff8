"""A real Prometheus server (Debian's `prometheus` package) for the deploy/ tests: a temporary
config scraping the given targets every second and evaluating deploy/prometheus/rules.yaml
every second, queried through its HTTP API."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.deploy.live import ROOT

RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"

#: .ci/run sets this: there a missing Prometheus is a failure, not a skip.
REQUIRE = os.environ.get("HEIMDALL_REQUIRE_PROMETHEUS") == "1"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian: apt-get install -y prometheus)"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url = url
        self.http = http

    async def query(self, expr: str) -> list[dict[str, Any]]:
        async with self.http.get(f"{self.url}/api/v1/query", params={"query": expr}) as r:
            body = await r.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def get(self, path: str) -> Any:
        async with self.http.get(f"{self.url}{path}") as r:
            body = await r.json()
        assert body["status"] == "success", (path, body)
        return body["data"]

    async def wait_for(self, expr: str, within: float = 30.0) -> list[dict[str, Any]]:
        """The query's result once it is non-empty; fails after `within` seconds."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            result = await self.query(expr)
            if result:
                return result
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no data for {expr!r} after {within:.0f}s")
            await asyncio.sleep(0.5)


@asynccontextmanager
async def prometheus(tmp: Path, jobs: dict[str, list[str]]) -> AsyncIterator[Prometheus]:
    """Prometheus scraping `jobs` (job name -> host:port targets), with the deploy rules."""
    exe = binary("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": job, "honor_labels": True, "static_configs": [{"targets": targets}]}
            for job, targets in jobs.items()
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        exe,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                if proc.returncode is not None:
                    raise AssertionError(
                        f"prometheus exited: {(tmp / 'prometheus.log').read_text()}"
                    )
                try:
                    async with http.get(f"{url}/-/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("prometheus did not become ready")
            yield Prometheus(url, http)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


_GROUPING = re.compile(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "by", "on", "without", "ignoring"}


def selectors(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (vector selectors, not functions or
    label names): the names a renamed metric would leave without data."""
    names = set(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text):
        if m.group(1) not in _KEYWORDS:
            names.add(m.group(1))
    return names
