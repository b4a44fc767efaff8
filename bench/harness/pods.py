"""The simulated fleet: `heimdall-proxy sim` pods on free loopback ports, each started fresh
for a target so queues and caches start empty; the flags the simulator takes; the fast
stand-in upstream (`bench.harness.fast_upstream`) for the overhead runs."""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench.harness.procs import (
    HOST,
    Proc,
    bench_module,
    free_port,
    heimdall_cmd,
    http_get,
    wait_until,
)

if TYPE_CHECKING:
    from bench.harness.targets import Target


@dataclass(slots=True)
class Pod:
    name: str
    port: int
    kv_events_port: int | None = None
    kv_replay_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass
class FleetSpec:
    pods: int
    model: str
    sim_args: list[str]
    time_scale: float
    seed: int
    #: "on", "off", or "auto": KV events for gateway targets when the simulator has them
    kv_events: str
    supported: set[str] = field(default_factory=set)
    #: flags for pod i only (cycled): unequal pods, e.g. a slower cost model on some
    per_pod_args: list[list[str]] = field(default_factory=list)

    def kv_events_for(self, target: Target) -> bool:
        if self.kv_events == "auto":
            return target.kind == "gateway" and "--kv-events-port" in self.supported
        return self.kv_events == "on"


def sim_flags() -> set[str]:
    """Long options `heimdall-proxy sim` accepts (read from its --help)."""
    out = subprocess.run(
        [*heimdall_cmd(), "sim", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out))


def split_sim_args(args: Sequence[str], supported: set[str]) -> tuple[list[str], list[str]]:
    """Keep the flags (with their values) the simulator supports; return (kept, dropped)."""
    kept: list[str] = []
    dropped: list[str] = []
    current = kept
    for tok in args:
        if tok.startswith("--"):
            current = kept if tok.split("=", 1)[0] in supported else dropped
        current.append(tok)
    return kept, dropped


def sim_command(spec: FleetSpec, pod: Pod, index: int) -> list[str]:
    argv = [*heimdall_cmd(), "sim", "--host", HOST, "--port", str(pod.port), "--name", pod.name]
    argv += ["--model", spec.model, "--log-format", "text"]
    if "--time-scale" in spec.supported:
        argv += ["--time-scale", f"{spec.time_scale:g}"]
    if "--seed" in spec.supported:
        argv += ["--seed", str(spec.seed + index)]
    if pod.kv_events_port is not None:
        argv += ["--kv-events-port", str(pod.kv_events_port)]
        if pod.kv_replay_port is not None and "--kv-events-replay-port" in spec.supported:
            argv += ["--kv-events-replay-port", str(pod.kv_replay_port)]
    own = spec.per_pod_args[index % len(spec.per_pod_args)] if spec.per_pod_args else []
    return argv + spec.sim_args + own


def sim_extra(spec: FleetSpec) -> list[str]:
    extra = []
    if "--time-scale" in spec.supported:
        extra += ["--time-scale", f"{spec.time_scale:g}"]
    if "--seed" in spec.supported:
        extra += ["--seed", f"{spec.seed}+i"]
    return extra + spec.sim_args


@contextlib.contextmanager
def fleet(spec: FleetSpec, logs: Path, prefix: str, kv_events: bool) -> Iterator[list[Pod]]:
    pods = [
        Pod(
            f"pod-{i}",
            free_port(),
            free_port() if kv_events else None,
            free_port() if kv_events else None,
        )
        for i in range(spec.pods)
    ]
    procs = [
        Proc(p.name, sim_command(spec, p, i), logs / f"{prefix}-{p.name}.log")
        for i, p in enumerate(pods)
    ]
    try:
        for proc in procs:
            proc.start()
        for pod, proc in zip(pods, procs, strict=True):
            wait_until(proc, lambda u=pod.url: http_get(u + "/health")[0] == 200, "pod health")
        yield pods
    finally:
        for proc in procs:
            proc.stop()


def fast_upstream_argv(port: int, model: str | None = None) -> list[str]:
    """The fast stand-in for vLLM (bench/harness/fast_upstream.py) on `port`."""
    argv = [*bench_module("bench.harness.fast_upstream"), "--port", str(port)]
    return argv + (["--model", model] if model else [])
