"""Compare routers on one workload, each in front of its own fresh simulated fleet.

For every target, N simulated vLLM pods (``heimdall-proxy sim`` subprocesses) are started on
free loopback ports, the router is started in front of them, the workload is replayed open-loop
(bench/runner.py) while the pods' /metrics are polled, then everything is stopped. A new fleet
per target means every target starts with empty queues and caches.

Targets:

* ``round_robin``, ``cache_aware`` (or any ``vllm-router:POLICY``): vllm-router from PyPI
  (``pip install vllm-router``), ``--policy POLICY --worker-urls <pods>``;
* ``gateway:PATH`` (or just a ``.yaml`` path): ``heimdall-proxy serve`` on a copy of the config
  whose ``endpoints:`` are replaced by the simulated pods (plugins, profiles and feature gates
  are kept; pod i takes the labels of the config's endpoint i modulo their number).

    python bench/compare.py --workload seed001-small --pods 4 \\
        --targets round_robin gateway:config/demo.yaml

Writes per-target result JSON and logs under ``--out-dir`` (bench/out/<workload>/), a PNG of
per-pod queues per target into ``--plots-dir`` (bench/plots/) and a section for the workload in
``--results`` (bench/RESULTS.md), replacing that workload's previous section.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime as dt
import importlib.util
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, Any

import yaml

if __package__ in (None, ""):  # run as `python bench/compare.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import runner
from bench.machine import cpu_model, git_dirty, git_head
from bench.workloads import PRESETS, Workload, add_workload_args, workload_from_args

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
HOST = "127.0.0.1"
ROUTER_POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)


# ---- targets ------------------------------------------------------------------------------


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


# ---- the gateway config -------------------------------------------------------------------


@dataclass(slots=True)
class Pod:
    name: str
    port: int
    kv_events_port: int | None = None
    kv_replay_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


def gateway_config(doc: Mapping[str, Any], pods: Sequence[Pod]) -> dict[str, Any]:
    """A copy of a gateway config with its `endpoints:` replaced by `pods`.

    Everything else (the EndpointPickerConfig at the top level or under `config:`, feature
    gates, other keys) is kept as is. Pod i takes the labels of the config's endpoint
    i % len(endpoints), so label-based configs (roles, context-length ranges) keep their
    meaning, replicated over a larger fleet.
    """
    out = copy.deepcopy(dict(doc))
    old = out.get("endpoints") or []
    endpoints = []
    for i, pod in enumerate(pods):
        ep: dict[str, Any] = {"name": pod.name, "url": pod.url}
        src = old[i % len(old)] if old else None
        if isinstance(src, Mapping) and src.get("labels"):
            ep["labels"] = dict(src["labels"])
        if pod.kv_events_port is not None:
            ep["kvEvents"] = f"tcp://{HOST}:{pod.kv_events_port}"
        endpoints.append(ep)
    out["endpoints"] = endpoints
    return out


# ---- processes ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _script(name: str, module: str) -> list[str]:
    """A console script next to this interpreter, else on PATH, else `python -m module`."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return [str(local)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", module]


def heimdall_cmd() -> list[str]:
    return _script("heimdall-proxy", "heimdall_proxy")


def router_cmd() -> list[str]:
    return _script("vllm-router", "vllm_router.launch_router")


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


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> Proc:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the process so far (Linux /proc), None elsewhere."""
        if not self.alive():
            return None
        assert self.popen is not None
        try:
            fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, grace: float = 5.0) -> None:
        if self.popen is not None and self.popen.poll() is None:
            # The process leads its own session (start_new_session): signal only that group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(grace)
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, n: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def wait_until(proc: Proc, check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited while waiting for {what}:\n{proc.tail()}")
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what} ({proc.name}):\n{proc.tail()}")


# ---- one target ---------------------------------------------------------------------------


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


def router_command(
    target: Target, pods: Sequence[Pod], port: int, config_path: Path | None, extra: Sequence[str]
) -> list[str]:
    if target.kind == "vllm-router":
        return [
            *router_cmd(),
            "--host",
            HOST,
            "--port",
            str(port),
            "--policy",
            target.arg,
            "--worker-urls",
            *[p.url for p in pods],
            "--worker-startup-check-interval",
            "1",
            "--prometheus-host",
            HOST,
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warning",
            *extra,
        ]
    assert config_path is not None
    return [
        *heimdall_cmd(),
        "serve",
        "--config",
        str(config_path),
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-format",
        "text",
        "-v",
        "0",
        *extra,
    ]


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


def _router_ready(target: Target, url: str, n_pods: int, model: str) -> bool:
    if target.kind == "vllm-router":
        status, body = http_get(url + "/readiness")
        return status == 200 and f'"healthy_workers":{n_pods}' in body.replace(" ", "")
    status, _ = http_get(url + "/ready")
    if status != 200:
        return False
    _, text = http_get(url + "/metrics")
    ready = runner.parse_metrics(text).get("inference_pool_ready_pods")
    if ready is not None and ready < n_pods:
        return False
    status, body = http_get(url + "/v1/models")
    return status == 200 and f'"{model}"' in body


@dataclass
class TargetRun:
    target: Target
    result: runner.RunResult
    router_cpu: float | None
    commands: dict[str, list[str]]


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
    with fleet(spec, logs, target.slug, spec.kv_events_for(target)) as pods:
        config_path = None
        profiles = None
        if target.kind == "gateway":
            with open(target.arg, encoding="utf-8") as f:
                doc = yaml.safe_load(f) or {}
            profiles = profile_summary(doc)
            config_path = out_dir / f"{target.slug}.config.yaml"
            config_path.write_text(yaml.safe_dump(gateway_config(doc, pods), sort_keys=False))
        port = free_port()
        extra = router_args if target.kind == "vllm-router" else gateway_args
        argv = router_command(target, pods, port, config_path, extra)
        proc = Proc(target.slug, argv, logs / f"{target.slug}-router.log").start()
        try:
            url = f"http://{HOST}:{port}"
            wait_until(
                proc,
                lambda: _router_ready(target, url, len(pods), spec.model),
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


# ---- the report ---------------------------------------------------------------------------


def machine_info() -> dict[str, str]:
    cpu = cpu_model(platform.processor() or "unknown")
    commit = git_head() or "unknown"
    if commit != "unknown" and git_dirty("heimdall_proxy"):
        commit += " + uncommitted changes under heimdall_proxy/"
    try:
        router_version = version("vllm-router")
    except PackageNotFoundError:
        router_version = "not installed"
    return {
        "arch": platform.machine(),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "commit": commit,
        "vllm_router": router_version,
    }


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def results_table(runs: Sequence[TargetRun]) -> list[str]:
    lines = [
        "| target | wall-clock (s) | TTFT p50 | TTFT p95 | TTFT p99 | E2E p50 | E2E p95 "
        "| E2E p99 | errors | prefix hit rate | pods drained, first / last (s) | router CPU (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run.result.summary
        rate = s.get("prefix_hit_rate")
        drained = s.get("pods_drained")
        drain = f"{drained['first']:.1f} / {drained['last']:.1f}" if drained else "-"
        lines.append(
            f"| {run.target.label} | {s['wall_clock']:.1f} "
            f"| {_s(s['ttft']['p50'])} | {_s(s['ttft']['p95'])} | {_s(s['ttft']['p99'])} "
            f"| {_s(s['e2e']['p50'])} | {_s(s['e2e']['p95'])} | {_s(s['e2e']['p99'])} "
            f"| {s['errors']} | {'n/a' if rate is None else f'{rate:.1%}'} "
            f"| {drain} "
            f"| {_s(run.router_cpu, 1)} |"
        )
    return lines


def by_tag_table(runs: Sequence[TargetRun]) -> list[str]:
    tags = sorted({t for run in runs for t in run.result.summary["by_tag"]})
    head = "| target | " + " | ".join(f"{t} E2E p50 / p95 (s)" for t in tags) + " |"
    lines = [head, "|---|" + "---:|" * len(tags)]
    for run in runs:
        by_tag = run.result.summary["by_tag"]
        cells = []
        for t in tags:
            e2e = by_tag.get(t, {}).get("e2e", {})
            cells.append(f"{_s(e2e.get('p50'))} / {_s(e2e.get('p95'))}")
        lines.append(f"| {run.target.label} | " + " | ".join(cells) + " |")
    return lines


def per_pod_table(runs: Sequence[TargetRun]) -> list[str]:
    """Requests and output tokens each pod served (from the x-sim-pod response header)."""
    pods = sorted({p for run in runs for p in run.result.summary.get("requests_per_pod", {})})
    if not pods:
        return []
    lines = [
        "Requests / output tokens per pod:",
        "",
        "| target | " + " | ".join(pods) + " |",
        "|---|" + "---:|" * len(pods),
    ]
    for run in runs:
        reqs = run.result.summary.get("requests_per_pod", {})
        toks = run.result.summary.get("output_tokens_per_pod", {})
        cells = [f"{reqs.get(p, 0)} / {toks.get(p, 0) / 1000:.1f}k" for p in pods]
        lines.append(f"| {run.target.label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def profile_summary(doc: Mapping[str, Any]) -> str:
    """`profile: plugin xweight, ...` of a gateway config, for the record."""
    epp = doc.get("config") if isinstance(doc.get("config"), Mapping) else doc
    profiles = epp.get("schedulingProfiles") or []
    if not profiles:
        plugins = [str(p.get("type")) for p in epp.get("plugins") or [] if isinstance(p, Mapping)]
        return "default: " + (", ".join(plugins) or "(Heimdall defaults)")
    parts = []
    for prof in profiles:
        refs = []
        for ref in prof.get("plugins") or []:
            weight = ref.get("weight")
            refs.append(str(ref.get("pluginRef")) + (f" x{weight:g}" if weight is not None else ""))
        parts.append(f"{prof.get('name')}: {', '.join(refs)}")
    return "; ".join(parts)


def section_markers(workload: str) -> tuple[str, str]:
    return f"<!-- routing:{workload}:begin -->", f"<!-- routing:{workload}:end -->"


def render_section(
    workload: Workload,
    runs: Sequence[TargetRun],
    *,
    command: str,
    machine: Mapping[str, str],
    spec: FleetSpec,
    dropped: Sequence[str],
    plot: str | None,
    notes: Sequence[str] = (),
) -> str:
    begin, end = section_markers(workload.name)
    m = machine
    scale = spec.time_scale
    lines = [
        begin,
        f"## Routing: {workload.name}",
        "",
        f"Run {dt.date.today().isoformat()} with:",
        "",
        "```sh",
        command,
        "```",
        "",
        f"- Machine: {m['arch']}, {m['nproc']} CPUs ({m['cpu']}), {m['os']}, "
        f"Python {m['python']}; heimdall-proxy at `{m['commit']}`, "
        f"vllm-router {m['vllm_router']}.",
        f"- Workload: {workload.describe()}" + (f" (offsets x{scale:g})." if scale != 1 else "."),
        f"- Fleet: {spec.pods} fresh simulated pods per target, each "
        f"`{shlex.join(['heimdall-proxy', 'sim', '--model', spec.model, *sim_extra(spec)])}`.",
    ]
    kv_targets = [r.target.label for r in runs if spec.kv_events_for(r.target)]
    if kv_targets:
        lines.append(
            f"- KV events on for {', '.join(kv_targets)}: each pod also had `--kv-events-port` "
            "(and `--kv-events-replay-port`) and the gateway config `kvEvents:` pointing at it."
        )
    if dropped:
        lines.append(f"- Not supported by this simulator, so not passed: `{' '.join(dropped)}`.")
    for run in runs:
        if run.result.meta.get("profiles"):
            lines.append(f"- {run.target.label} profiles: {run.result.meta['profiles']}.")
    lines += [f"- {note}" for note in notes]
    lines += ["", "Latencies in seconds.", "", *results_table(runs), "", *by_tag_table(runs), ""]
    lines += per_pod_table(runs)
    if plot:
        lines += [f"![per-pod queue and running requests over time]({plot})", ""]
    lines.append(end)
    return "\n".join(lines) + "\n"


def sim_extra(spec: FleetSpec) -> list[str]:
    extra = []
    if "--time-scale" in spec.supported:
        extra += ["--time-scale", f"{spec.time_scale:g}"]
    if "--seed" in spec.supported:
        extra += ["--seed", f"{spec.seed}+i"]
    return extra + spec.sim_args


def write_section(path: Path, workload_name: str, section: str) -> None:
    """Replace the workload's section in `path` (markers), or append one; keep the rest."""
    begin, end = section_markers(workload_name)
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


def auto_notes(runs: Sequence[TargetRun], spec: FleetSpec) -> list[str]:
    notes = []
    if "--time-scale" not in spec.supported and spec.time_scale != 1:
        notes.append(
            "The simulator has no `--time-scale`: pods ran at their own speed; only the "
            "workload's send offsets were scaled."
        )
    if all(run.result.summary.get("prefix_hit_rate") is None for run in runs):
        notes.append(
            "Prefix hit rate n/a: the pods expose no `vllm:prefix_cache_queries_total` / "
            "`vllm:prefix_cache_hits_total` counters (or saw no queries)."
        )
    return notes


# ---- main ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run one workload through several routers, each on a fresh simulated fleet."
    )
    add_workload_args(parser)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["round_robin", "cache_aware", "gateway:config/demo.yaml"],
        help="round_robin, cache_aware, vllm-router:POLICY, gateway:CONFIG.yaml "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="scale the workload's offsets and (if supported) the simulator's durations "
        "(default: the preset's)",
    )
    parser.add_argument(
        "--sim-args",
        default=None,
        help="extra flags for every `heimdall-proxy sim` (default: the preset's); flags the "
        "simulator does not support are dropped with a warning",
    )
    parser.add_argument(
        "--kv-events",
        choices=("auto", "on", "off"),
        default="auto",
        help="give each pod a --kv-events-port and the gateway its kvEvents (auto: for gateway "
        "targets, when the simulator supports it)",
    )
    parser.add_argument("--router-args", default="", help="extra flags for vllm-router")
    parser.add_argument("--gateway-args", default="", help="extra flags for heimdall-proxy serve")
    parser.add_argument("--poll-interval", type=float, default=0.25)
    parser.add_argument("--timeout", type=float, default=3600.0, help="per request, seconds")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/out/<workload>")
    parser.add_argument("--plots-dir", type=Path, default=BENCH_DIR / "plots")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md")
    parser.add_argument("--no-results", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument("--note", action="append", default=[], help="a line for RESULTS.md")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        targets = [parse_target(t) for t in args.targets]
        base = workload_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    preset = PRESETS[args.workload]
    scale = preset.time_scale if args.time_scale is None else args.time_scale
    workload = base.scaled(scale)
    needs_router = any(t.kind == "vllm-router" for t in targets)
    if needs_router and importlib.util.find_spec("vllm_router") is None:
        parser.error("vllm-router is not installed: pip install -e '.[bench]'")

    supported = sim_flags()
    requested = list(preset.sim_args) if args.sim_args is None else shlex.split(args.sim_args)
    sim_args, dropped = split_sim_args(requested, supported)
    if "--time-scale" not in supported and scale != 1:
        dropped = ["--time-scale", f"{scale:g}", *dropped]
    for flag in dropped:
        if flag.startswith("--"):
            print(f"warning: `heimdall-proxy sim` has no {flag}; not passed", file=sys.stderr)
    spec = FleetSpec(args.pods, args.model, sim_args, scale, args.seed, args.kv_events, supported)
    out_dir = args.out_dir or BENCH_DIR / "out" / workload.name
    out_dir.mkdir(parents=True, exist_ok=True)
    print(workload.describe(), file=sys.stderr)

    load_before = os.getloadavg()[0]
    runs: list[TargetRun] = []
    for i, target in enumerate(targets):
        if i:
            time.sleep(1.0)  # let the previous fleet's sockets and CPU settle
        print(f"== {target.label}", file=sys.stderr)
        run = run_target(
            target,
            workload,
            spec,
            out_dir,
            router_args=shlex.split(args.router_args),
            gateway_args=shlex.split(args.gateway_args),
            poll_interval=args.poll_interval,
            timeout=args.timeout,
            progress=not args.no_progress,
        )
        print(runner.format_summary(run.result.summary), file=sys.stderr)
        runs.append(run)

    plot_rel = None
    try:
        from bench.plots import plot_queues

        png = plot_queues(
            [(r.target.label, r.result.to_json()) for r in runs],
            args.plots_dir / f"{workload.name}-queues.png",
            title=f"{workload.name}: per-pod queues, {args.pods} pods",
        )
        print(f"plot: {png}", file=sys.stderr)
        with contextlib.suppress(ValueError):
            plot_rel = png.resolve().relative_to(args.results.resolve().parent).as_posix()
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')", file=sys.stderr)

    command = shlex.join(["python", "bench/compare.py", *argv])
    section = render_section(
        workload,
        runs,
        command=command,
        machine=machine_info(),
        spec=spec,
        dropped=dropped,
        plot=plot_rel,
        notes=[
            f"1-minute load average before the run {load_before:.2f}, after "
            f"{os.getloadavg()[0]:.2f} (on {os.cpu_count()} CPUs, shared with other work).",
            *auto_notes(runs, spec),
            *args.note,
        ],
    )
    print(section)
    if not args.no_results:
        write_section(args.results, workload.name, section)
        print(f"wrote the {workload.name} section of {args.results}", file=sys.stderr)
    return 0 if all(r.result.summary["errors"] == 0 for r in runs) else 2


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
