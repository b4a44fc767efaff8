"""Shared fixtures of the real-vLLM end-to-end tests: the two vLLM CPU pods (started once per
session with bench/real_vllm/start_pods.sh, stopped at the end) and a gateway started as a
subprocess, exactly as a user starts it, with any config."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from heimdall_proxy.config.defaults import DEFAULT_EPP

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "bench" / "real_vllm"
VENV = Path(os.environ.get("VLLM_VENV", REPO / ".venv-vllm"))
MODEL_DIR = Path(os.environ.get("VLLM_MODEL_DIR", SCRIPTS / ".model" / "tiny-llama"))
MODEL = "tiny-llama"
BLOCK_SIZE = 32
HEADER = "x-decoder-host-port"


@dataclass(frozen=True)
class Pod:
    name: str
    url: str
    kv_events: str
    replay: str
    topic: str

    @property
    def host_port(self) -> str:
        return self.url.removeprefix("http://")


@dataclass(frozen=True)
class GatewayProcess:
    url: str
    log: Path


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port() -> int:
    """A base port with BASE, BASE+1 (HTTP) and BASE+1000..BASE+1003 (KV events) free."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 40000, 2)
        if all(_free(p) for p in (base, base + 1, *range(base + 1000, base + 1004))):
            return base
    raise RuntimeError("no free ports for the vLLM pods")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def http_post_json(url: str, body: Mapping[str, Any], timeout: float = 120.0) -> Any:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="session")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Pod]]:
    if not (VENV / "bin" / "vllm").exists():
        pytest.skip(f"no vLLM venv at {VENV}: run `bash bench/real_vllm/setup.sh` first")
    if not (MODEL_DIR / "config.json").exists():
        pytest.skip(f"no model at {MODEL_DIR}: run `bash bench/real_vllm/setup.sh` first")
    run_dir = tmp_path_factory.mktemp("vllm-pods")
    base = free_base_port()
    env = {
        **os.environ,
        "RUN_DIR": str(run_dir),
        "VLLM_VENV": str(VENV),
        "VLLM_MODEL_DIR": str(MODEL_DIR),
        "VLLM_MODEL_NAME": MODEL,
    }
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPTS / "start_pods.sh"), "2", str(base)],
            env=env,
            capture_output=True,
            text=True,
            timeout=480,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"start_pods.sh failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        rows = (run_dir / "pods.tsv").read_text().splitlines()
        yield [Pod(*row.split("\t")) for row in rows]
    finally:
        # Also after a timeout: the pid files are written before start_pods.sh waits.
        subprocess.run(
            ["bash", str(SCRIPTS / "stop_pods.sh")],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )


@contextlib.contextmanager
def gateway_process(config: Mapping[str, Any], work: Path) -> Iterator[GatewayProcess]:
    """`heimdall-proxy serve --config <config> --response-header` as a subprocess, once it
    lists the pods' model; terminated on exit."""
    path = work / "gateway.yaml"
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    port = free_base_port()
    url = f"http://127.0.0.1:{port}"
    log_path = work / "gateway.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "heimdall_proxy",
                "serve",
                "--config",
                str(path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--response-header",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"gateway exited ({proc.returncode}):\n{log_path.read_text()}")
            with contextlib.suppress(OSError):
                status, body = http_get(f"{url}/v1/models")
                if status == 200 and json.loads(body)["data"]:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"gateway not serving models in 60 s:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield GatewayProcess(url, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def gateway_config(pods: list[Pod]) -> dict[str, Any]:
    """The default EndpointPickerConfig with the pods as its endpoints."""
    return {
        **copy.deepcopy(DEFAULT_EPP),
        "endpoints": [{"name": p.name, "url": p.url, "kvEvents": p.kv_events} for p in pods],
    }


@pytest.fixture(scope="session")
def gateway(pods: list[Pod], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway subprocess in front of the pods for the session, as a user starts it."""
    with gateway_process(gateway_config(pods), tmp_path_factory.mktemp("gateway")) as gw:
        yield gw
