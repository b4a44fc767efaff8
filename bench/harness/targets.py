"""A target: a router (vllm-router with a policy, or the gateway with a config) started in front
of its own fresh simulated fleet, loaded with a workload by the runner, then stopped.

    round_robin, cache_aware, vllm-router:POLICY    vllm-router --policy POLICY
    gateway:PATH, or any PATH ending in .yaml       heimdall-proxy serve on PATH's copy
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.harness import gateway, peers, runner, sidecars
from bench.harness.peers import ROUTER_POLICIES
from bench.harness.pods import FleetSpec, Pod, fleet, sim_command
from bench.harness.procs import HOST, Proc, free_port, wait_until
from bench.harness.workloads import Workload


@dataclass(frozen=True, slots=True)
class Target:
    kind: str  # "vllm-router" | "gateway"
    arg: str  # the policy, or the config path

    @property
    def label(self) -> str:
        if self.kind == "vllm-router":
            return f"vllm-router {self.arg}"
        return f"heimdall-proxy {Path(self.arg).name}"

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "-", self.label.removesuffix(".yaml")).strip("-")


def parse_target(spec: str) -> Target:
    kind, sep, arg = spec.partition(":")
    if not sep:
        if spec in ROUTER_POLICIES:
            return Target("vllm-router", spec)
        if spec.endswith((".yaml", ".yml")):
            return Target("gateway", spec)
        raise ValueError(
            f"unknown target {spec!r}: use a vllm-router policy ({', '.join(ROUTER_POLICIES)}), "
            "vllm-router:POLICY or gateway:CONFIG.yaml"
        )
    if kind == "vllm-router":
        if arg not in ROUTER_POLICIES:
            raise ValueError(f"unknown vllm-router policy {arg!r}")
        return Target(kind, arg)
    if kind == "gateway":
        return Target(kind, arg)
    raise ValueError(f"unknown target kind {kind!r} in {spec!r}")


def router_command(
    target: Target, pods: Sequence[Pod], port: int, config_path: Path | None, extra: Sequence[str]
) -> list[str]:
    """The target's router on HOST:`port` in front of `pods` (`config_path`: the gateway's
    rewritten config)."""
    if target.kind == "vllm-router":
        return peers.router_command(target.arg, [p.url for p in pods], port, extra)
    assert config_path is not None
    return gateway.serve_command(config_path, port, extra)


def router_ready(target: Target, url: str, n_pods: int, model: str) -> bool:
    """The target's router sees all `n_pods` (and, the gateway, lists `model`)."""
    if target.kind == "vllm-router":
        return peers.router_ready(url, n_pods)
    return gateway.ready(url, n_pods, model)


@dataclass
class TargetRun:
    target: Target
    result: runner.RunResult
    router_cpu: float | None
    commands: dict[str, list[str]]


def with_roles(spec: FleetSpec, roles: Sequence[str | None]) -> FleetSpec:
    """`spec` with pod i started as `--role roles[i]` (a disaggregated config's pods), after
    its own per-pod flags; unchanged when no pod has a role."""
    if not any(roles):
        return spec
    own = spec.per_pod_args
    per_pod = [
        [*(own[i % len(own)] if own else []), *(["--role", r] if r else [])]
        for i, r in enumerate(roles)
    ]
    return dataclasses.replace(spec, per_pod_args=per_pod)


def run_target(
    target: Target,
    workload: Workload,
    spec: FleetSpec,
    out_dir: Path,
    *,
    router_args: Sequence[str] = (),
    gateway_args: Sequence[str] = (),
    poll_interval: float = 0.25,
    timeout: float = 3600.0,
    progress: bool = True,
) -> TargetRun:
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {}
    if target.kind == "gateway":
        with open(target.arg, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        spec = with_roles(spec, gateway.pod_roles(doc, spec.pods))
    with contextlib.ExitStack() as stack:
        pods = stack.enter_context(fleet(spec, logs, target.slug, spec.kv_events_for(target)))
        config_path = None
        profiles = None
        if target.kind == "gateway":
            profiles = gateway.profile_summary(doc)
            served = stack.enter_context(sidecars.started(doc, logs, target.slug))
            config_path = out_dir / f"{target.slug}.config.yaml"
            config_path.write_text(
                yaml.safe_dump(gateway.gateway_config(served, pods), sort_keys=False)
            )
        port = free_port()
        extra = router_args if target.kind == "vllm-router" else gateway_args
        argv = router_command(target, pods, port, config_path, extra)
        proc = Proc(target.slug, argv, logs / f"{target.slug}-router.log").start()
        try:
            url = f"http://{HOST}:{port}"
            wait_until(
                proc,
                lambda: router_ready(target, url, len(pods), spec.model),
                "the router to see every pod",
            )
            cpu0 = proc.cpu_seconds()
            result = asyncio.run(
                runner.run_workload(
                    workload,
                    url,
                    {p.name: p.url for p in pods},
                    poll_interval=poll_interval,
                    request_timeout=timeout,
                    progress=progress,
                    label=target.label,
                )
            )
            cpu1 = proc.cpu_seconds()
            if not proc.alive():
                raise RuntimeError(f"{target.label} died during the run:\n{proc.tail()}")
        finally:
            proc.stop()
        commands = {"router": argv, "pod-0": sim_command(spec, pods[0], 0)}
    router_cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    result.meta.update(
        target=target.label,
        router_cpu_seconds=router_cpu,
        commands=commands,
        profiles=profiles,
        time_scale=spec.time_scale,
    )
    result.save(out_dir / f"{target.slug}.json")
    return TargetRun(target, result, router_cpu, commands)
