"""What a shipped config needs to run as a bench target: private sidecars (tokenizer, Redis)
for the precise prefix config, sim roles for the disaggregated ones."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness import gateway, sidecars
from bench.harness.pods import FleetSpec
from bench.harness.targets import with_roles
from heimdall_proxy.sim.tokens import SimRequestTokenizer
from heimdall_proxy.tokenization.uds import UDSTokenizerClient

ROOT = Path(__file__).resolve().parents[2]
CHAT = {"messages": [{"role": "user", "content": "route me to the pod that holds this"}]}


def _load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "config" / name).read_text())
    assert isinstance(doc, dict)
    return doc


def test_only_the_precise_configs_need_sidecars() -> None:
    for name in ("precise-prefix-cache.yaml", "precise-prefix-cache-recommended.yaml"):
        want = sidecars.needs(_load(name))
        assert want.tokenizer_models == ("meta-llama/Llama-3.2-1B-Instruct",)
        assert want.redis
    others = [p.name for p in (ROOT / "config").glob("*.yaml") if not p.name.startswith("precise-")]
    assert others and not any(sidecars.needs(_load(n)).any for n in others)


def test_rewrite_points_at_the_sidecars_and_keeps_everything_else() -> None:
    doc = _load("precise-prefix-cache.yaml")
    out = sidecars.rewrite(doc, "/tmp/x/t.sock", "redis://127.0.0.1:1")
    addresses = [v for k, v, _ in sidecars._walk(out) if k in ("socketFile", "address")]
    assert addresses == ["/tmp/x/t.sock", "/tmp/x/t.sock", "redis://127.0.0.1:1"]
    assert doc != out  # a copy: the loaded document is untouched
    back = sidecars.rewrite(
        out,
        "/tmp/tokenizer/tokenizer-uds.socket",
        "redis://127.0.0.1:6379",
    )
    assert back == doc  # nothing else changed (plugins, weights, profiles)


def test_disaggregated_pods_take_their_endpoints_roles_cyclically() -> None:
    assert gateway.pod_roles(_load("epd-disagg.yaml"), 5) == [
        "encode", "encode", "prefill", "decode", "encode",
    ]  # fmt: skip
    assert gateway.pod_roles(_load("recommended.yaml"), 2) == [None, None]
    # a context-length label is no role
    assert gateway.pod_roles(_load("context-length.yaml"), 2) == [None, None]
    spec = FleetSpec(3, "m", [], 1.0, 0, "off", per_pod_args=[["--a"], ["--b"]])
    assert with_roles(spec, [None, None, None]) is spec
    roled = with_roles(spec, ["prefill", None, "decode"])
    assert roled.per_pod_args == [
        ["--a", "--role", "prefill"],
        ["--b"],
        ["--a", "--role", "decode"],
    ]


@pytest.mark.slow  # starts redis-server and a tokenizer server
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
async def test_started_sidecars_tokenize_as_the_simulator_and_answer_redis(
    tmp_path: Path,
) -> None:
    doc = _load("precise-prefix-cache.yaml")
    with sidecars.started(doc, tmp_path, "t") as served:
        sock = next(v for k, v, _ in sidecars._walk(served) if k == "socketFile")
        client = UDSTokenizerClient(sock, "meta-llama/Llama-3.2-1B-Instruct", timeout=5.0)
        try:
            ids = await client.tokenize("chat", CHAT)
        finally:
            await client.close()
        assert ids == SimRequestTokenizer().tokenize_request("chat", CHAT)
        url = next(v for k, v, _ in sidecars._walk(served) if k == "address")
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"PING\r\n")
            assert s.recv(16).startswith(b"+PONG")
    assert not await asyncio.to_thread(os.path.exists, sock)  # stopped and cleaned up
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
