"""The services a gateway config names besides its pods, started privately for one target.

config/precise-prefix-cache.yaml points at a tokenizer sidecar on a Unix socket and a Redis
index at 127.0.0.1:6379, as a deployment would. A bench target gets its own of each: a
`heimdall-proxy tokenizer-server` serving every `modelName` the config names with the
simulator's tokenization (`--sim-model`, so the gateway's block keys match the simulated pods'
KV events), and a `redis-server` on a free port with nothing saved to disk. The config's copy
is rewritten to point at them; its plugins and weights are untouched. A shared Redis (other
benches, tests) would mix indexes; a fixed socket path would collide with another run.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.procs import HOST, HarnessError, Proc, free_port, heimdall_cmd, wait_until


@dataclass(frozen=True, slots=True)
class Needs:
    """What a config asks for beyond its pods."""

    #: models its tokenizer plugins and pools name (served with the simulator's tokenization)
    tokenizer_models: tuple[str, ...]
    redis: bool

    @property
    def any(self) -> bool:
        return bool(self.tokenizer_models) or self.redis


def _walk(node: Any) -> Iterator[tuple[str, Any, Any]]:
    """(key, value, parent mapping) of every mapping entry, depth first."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield str(key), value, node
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def needs(doc: Mapping[str, Any]) -> Needs:
    """The sidecars `doc` names: a Unix-socket tokenizer (any `socketFile`) serving its
    `modelName`s, and a Redis index (any `redisConfig`)."""
    uds = False
    models: list[str] = []
    redis = False
    for key, value, _ in _walk(doc):
        if key == "socketFile":
            uds = True
        elif key == "modelName" and isinstance(value, str) and value not in models:
            models.append(value)
        elif key == "redisConfig":
            redis = True
    return Needs(tuple(models) if uds else (), redis)


def rewrite(doc: Mapping[str, Any], socket_file: str | None, redis_url: str | None) -> Any:
    """A copy of `doc` with every `socketFile` set to `socket_file` and every
    `redisConfig.address` to `redis_url` (each only when given)."""
    out = copy.deepcopy(dict(doc))
    for key, value, parent in list(_walk(out)):
        assert isinstance(parent, dict)
        if key == "socketFile" and socket_file is not None:
            parent[key] = socket_file
        elif key == "redisConfig" and redis_url is not None and isinstance(value, dict):
            value["address"] = redis_url
    return out


def _socket_answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
        return True


def _redis_answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def started(doc: Mapping[str, Any], logs: Path, prefix: str) -> Iterator[Any]:
    """Start what `doc` needs (nothing for most configs) and yield its rewritten copy; stop
    them on exit."""
    want = needs(doc)
    if not want.any:
        yield doc
        return
    procs: list[Proc] = []
    tmp = Path(tempfile.mkdtemp(prefix="heimdall-bench-"))
    try:
        socket_file = redis_url = None
        if want.tokenizer_models:
            socket_file = str(tmp / "tokenizer.sock")
            argv = [*heimdall_cmd(), "tokenizer-server", "--socket", socket_file]
            for model in want.tokenizer_models:
                argv += ["--sim-model", model]
            proc = Proc(f"{prefix}-tokenizer", argv, logs / f"{prefix}-tokenizer.log").start()
            procs.append(proc)
            wait_until(proc, lambda: _socket_answers(socket_file), "the tokenizer socket")
        if want.redis:
            server = shutil.which("redis-server")
            if server is None:
                raise HarnessError("this config needs redis-server (apt-get install redis-server)")
            port = free_port()
            argv = [server, "--bind", HOST, "--port", str(port), "--save", "",
                    "--appendonly", "no", "--dir", str(tmp)]  # fmt: skip
            proc = Proc(f"{prefix}-redis", argv, logs / f"{prefix}-redis.log").start()
            procs.append(proc)
            wait_until(proc, lambda: _redis_answers(port), "redis")
            redis_url = f"redis://{HOST}:{port}"
        yield rewrite(doc, socket_file, redis_url)
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
