"""Overhead benchmark: gateway vs. a bare aiohttp forwarder vs. the upstream itself.

Starts ``bench.harness.fast_upstream``, ``bench.harness.bare_forwarder`` and the gateway
(``heimdall-proxy serve``) on free loopback ports, then measures each target with ``wrk``:

* throughput: ``wrk -t1 -c32 -d<duration>`` -> requests/s
* latency:    ``wrk -t1 -c1  -d<duration>`` -> p50 / p99

for ``--rounds`` rounds in alternating target order and reports the per-target medians plus the
ratios the gateway is held to (>= 0.8x the bare forwarder's throughput, <= 0.5 ms added p50 at
c=1).

On a shared machine the absolute figures of two rounds can differ by 2x, so the ratios are also
taken round by round (gateway and forwarder measured back to back) and reported as the median
with the spread; the CPU each server spends per request (user + system, from /proc) is steadier
than its throughput. ``--baseline DIR`` adds a fourth target, the gateway run from another copy
of the code (``PYTHONPATH=DIR``, e.g. ``git archive main heimdall_proxy | tar -x -C DIR``), so
before and after are interleaved in one invocation under the same load.

Run: ``python -m bench.overhead [--duration 10] [--rounds 3] [--json OUT] [--markdown]``
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from bench.harness import cli
from bench.harness.gateway import merge_config, serve_args
from bench.harness.machine import cpu_model, git_dirty, git_head
from bench.harness.peers import bare_forwarder_argv
from bench.harness.pods import fast_upstream_argv
from bench.harness.procs import (
    HarnessError,
    Proc,
    free_ports,
    group_cpu_seconds,
    heimdall_cmd,
    start_server,
    stop_servers,
    wait_ready,
)
from heimdall_proxy.config.defaults import DEFAULT_EPP

TARGETS = ("direct", "forwarder", "gateway", "baseline")
TARGET_LABELS = {
    "direct": "direct upstream",
    "forwarder": "bare forwarder",
    "gateway": "gateway",
    "baseline": "gateway baseline",
}
# Targets the gateway is held to.
MIN_RPS_RATIO_VS_FORWARDER = 0.8
MAX_ADDED_P50_MS = 0.5

# The EPP's default scorers, exactly as the gateway uses them when a config declares none.
BASE_CONFIG_TEMPLATE: dict[str, Any] = {
    "endpoints": [{"name": "upstream-0", "url": "<filled in>"}],
    **copy.deepcopy(DEFAULT_EPP),
}

WRK_RESULT_RE = re.compile(r"^BENCH_RESULT (?P<fields>.*)$", re.MULTILINE)

LUA_TEMPLATE = """\
wrk.method = "POST"
wrk.body = [==[{body}]==]
wrk.headers["Content-Type"] = "application/json"

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH_RESULT requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d " ..
    "status=%d timeout=%d mean_us=%.1f max_us=%d p50_us=%d p90_us=%d p99_us=%d p999_us=%d\\n",
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max,
    latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
"""


# --------------------------------------------------------------------------------------------
# wrk


@dataclass
class WrkResult:
    connections: int
    requests: int
    duration_s: float
    rps: float
    http_errors: int  # responses with status >= 400 ("Non-2xx or 3xx responses" in wrk)
    connect_errors: int
    read_errors: int
    write_errors: int
    timeouts: int
    mean_ms: float
    max_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    # CPU time (user + system) of the server under test / of the upstream per completed request,
    # from /proc over the run. Far less noisy than rps on a shared machine.
    cpu_us_per_req: float | None = None
    upstream_cpu_us_per_req: float | None = None

    @property
    def socket_errors(self) -> int:
        return self.connect_errors + self.read_errors + self.write_errors + self.timeouts

    @property
    def has_errors(self) -> bool:
        return self.requests == 0 or self.http_errors > 0 or self.socket_errors > 0

    def error_summary(self) -> str:
        parts = []
        if self.requests == 0:
            parts.append("no requests completed")
        if self.http_errors:
            parts.append(f"{self.http_errors} non-2xx")
        for name in ("connect_errors", "read_errors", "write_errors", "timeouts"):
            value = getattr(self, name)
            if value:
                parts.append(f"{value} {name.replace('_errors', '')}")
        return ", ".join(parts) if parts else "none"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["socket_errors"] = self.socket_errors
        out["has_errors"] = self.has_errors
        return out


def parse_wrk_output(stdout: str, connections: int) -> WrkResult:
    match = WRK_RESULT_RE.search(stdout)
    if match is None:
        raise HarnessError(f"wrk printed no BENCH_RESULT line; output was:\n{stdout}")
    fields: dict[str, float] = {}
    for item in match.group("fields").split():
        key, _, value = item.partition("=")
        fields[key] = float(value)
    duration_s = fields["duration_us"] / 1e6
    requests = int(fields["requests"])
    return WrkResult(
        connections=connections,
        requests=requests,
        duration_s=duration_s,
        rps=requests / duration_s if duration_s > 0 else 0.0,
        http_errors=int(fields["status"]),
        connect_errors=int(fields["connect"]),
        read_errors=int(fields["read"]),
        write_errors=int(fields["write"]),
        timeouts=int(fields["timeout"]),
        mean_ms=fields["mean_us"] / 1000,
        max_ms=fields["max_us"] / 1000,
        p50_ms=fields["p50_us"] / 1000,
        p90_ms=fields["p90_us"] / 1000,
        p99_ms=fields["p99_us"] / 1000,
        p999_ms=fields["p999_us"] / 1000,
    )


def run_wrk(
    wrk: str, url: str, lua: Path, *, connections: int, duration: int, timeout_s: int
) -> WrkResult:
    argv = [
        wrk,
        "-t1",
        f"-c{connections}",
        f"-d{duration}s",
        "--timeout",
        f"{timeout_s}s",
        "-s",
        str(lua),
        url,
    ]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=duration + timeout_s + 30, check=False
    )
    if proc.returncode != 0:
        raise HarnessError(
            f"{shlex.join(argv)} exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )
    return parse_wrk_output(proc.stdout, connections)


def measure(
    wrk: str,
    url: str,
    lua: Path,
    *,
    connections: int,
    duration: int,
    timeout_s: int,
    server_pgid: int,
    upstream_pgid: int,
) -> WrkResult:
    """``run_wrk`` plus the CPU the server under test and the upstream spent per request."""
    server_before = group_cpu_seconds(server_pgid)
    upstream_before = group_cpu_seconds(upstream_pgid)
    result = run_wrk(wrk, url, lua, connections=connections, duration=duration, timeout_s=timeout_s)
    if result.requests:
        per_req = 1e6 / result.requests
        result.cpu_us_per_req = (group_cpu_seconds(server_pgid) - server_before) * per_req
        result.upstream_cpu_us_per_req = (
            group_cpu_seconds(upstream_pgid) - upstream_before
        ) * per_req
    return result


# --------------------------------------------------------------------------------------------
# subprocesses


# --------------------------------------------------------------------------------------------
# readiness


# --------------------------------------------------------------------------------------------
# gateway config / command


def build_gateway_config(
    upstream_url: str, extra_path: Path | None, base_path: Path | None = None
) -> dict[str, Any]:
    config = copy.deepcopy(BASE_CONFIG_TEMPLATE)
    if base_path is not None:
        # A whole EndpointPickerConfig (e.g. config/recommended.yaml) in place of the EPP's
        # default scorers; only the endpoint list stays the bench's own.
        base = yaml.safe_load(base_path.read_text())
        if not isinstance(base, dict):
            raise HarnessError(f"--base-config {base_path} must hold a YAML mapping")
        config = {**base, "endpoints": config["endpoints"]}
    config["endpoints"][0]["url"] = upstream_url
    if extra_path is not None:
        extra = yaml.safe_load(extra_path.read_text())
        if extra is not None:
            if not isinstance(extra, dict):
                raise HarnessError(f"--config-extra {extra_path} must hold a YAML mapping")
            config = merge_config(config, extra)
    return config


def gateway_argv(
    args: argparse.Namespace, port: int, config_path: Path, upstream_url: str
) -> list[str]:
    if args.gateway_cmd:
        cmd = args.gateway_cmd
        for key, value in {
            "{port}": str(port),
            "{config}": str(config_path),
            "{upstream}": upstream_url,
            "{python}": sys.executable,
        }.items():
            cmd = cmd.replace(key, value)
        return shlex.split(cmd)
    return [*heimdall_cmd(), *serve_args(config_path, port, shlex.split(args.gateway_args))]


def baseline_argv(args: argparse.Namespace, port: int, config_path: Path) -> list[str]:
    """The gateway from the code in --baseline (`-P`: the working directory, this checkout,
    must not shadow it), with the same arguments as the gateway under test."""
    return [
        "env",
        f"PYTHONPATH={args.baseline}",
        sys.executable,
        "-P",
        "-m",
        "heimdall_proxy",
        *serve_args(config_path, port, shlex.split(args.gateway_args)),
    ]


# --------------------------------------------------------------------------------------------
# results


@dataclass
class TargetResults:
    name: str
    url: str
    throughput: list[WrkResult] = field(default_factory=list)
    latency: list[WrkResult] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return _median([r.rps for r in self.throughput])

    @property
    def p50_ms(self) -> float:
        return _median([r.p50_ms for r in self.latency])

    @property
    def p99_ms(self) -> float:
        return _median([r.p99_ms for r in self.latency])

    @property
    def c1_rps(self) -> float:
        return _median([r.rps for r in self.latency])

    @property
    def cpu_us(self) -> float | None:
        values = [r.cpu_us_per_req for r in self.throughput if r.cpu_us_per_req is not None]
        return statistics.median(values) if values else None

    @property
    def cpu_us_c1(self) -> float | None:
        values = [r.cpu_us_per_req for r in self.latency if r.cpu_us_per_req is not None]
        return statistics.median(values) if values else None

    @property
    def runs(self) -> list[WrkResult]:
        return [*self.throughput, *self.latency]

    @property
    def has_errors(self) -> bool:
        return any(r.has_errors for r in self.runs)

    def error_summary(self) -> str:
        bad = [
            f"c={r.connections} round {i + 1}: {r.error_summary()}"
            for runs in (self.throughput, self.latency)
            for i, r in enumerate(runs)
            if r.has_errors
        ]
        return "; ".join(bad)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "median": {
                "rps": self.rps,
                "p50_ms_c1": self.p50_ms,
                "p99_ms_c1": self.p99_ms,
                "rps_c1": self.c1_rps,
                "cpu_us_per_req": self.cpu_us,
                "cpu_us_per_req_c1": self.cpu_us_c1,
            },
            "has_errors": self.has_errors,
            "throughput_runs": [r.to_dict() for r in self.throughput],
            "latency_runs": [r.to_dict() for r in self.latency],
        }


def _median(values: list[float]) -> float:
    """The median, NaN for no values (e.g. the c=1 figures under --no-latency)."""
    return statistics.median(values) if values else math.nan


#: (numerator, denominator) target pairs compared round by round.
ROUND_PAIRS = (("gateway", "forwarder"), ("baseline", "forwarder"), ("gateway", "baseline"))


def round_ratios(num: TargetResults, den: TargetResults) -> dict[str, Any]:
    """Throughput and CPU-per-request ratios of `num` over `den` in each round (the two were
    measured minutes apart at most, under much the same load), with their median and range.
    Pairs of medians taken over all rounds mix rounds run under different load; these do
    not."""
    pairs = list(zip(num.throughput, den.throughput, strict=False))
    rps = [a.rps / b.rps for a, b in pairs if b.rps]
    cpu = [
        a.cpu_us_per_req / b.cpu_us_per_req
        for a, b in pairs
        if a.cpu_us_per_req and b.cpu_us_per_req
    ]
    out: dict[str, Any] = {"rps": rps, "cpu_per_req": cpu}
    for key, values in (("rps", rps), ("cpu_per_req", cpu)):
        if values:
            out[f"{key}_median"] = statistics.median(values)
            out[f"{key}_min"] = min(values)
            out[f"{key}_max"] = max(values)
    return out


def compute_summary(results: dict[str, TargetResults]) -> dict[str, Any]:
    ratios: dict[str, float] = {}
    added: dict[str, float] = {}
    checks: dict[str, bool] = {}
    d, f, g = (results.get(t) for t in ("direct", "forwarder", "gateway"))
    if g and f:
        ratios["gateway_vs_forwarder_rps"] = g.rps / f.rps
        if g.cpu_us and f.cpu_us:
            ratios["gateway_vs_forwarder_cpu_per_req"] = g.cpu_us / f.cpu_us
        checks["rps_ratio_vs_forwarder_ok"] = (
            ratios["gateway_vs_forwarder_rps"] >= MIN_RPS_RATIO_VS_FORWARDER
        )
        if g.latency and f.latency:
            added["gateway_minus_forwarder_p50_ms"] = g.p50_ms - f.p50_ms
            checks["added_p50_vs_forwarder_ok"] = (
                added["gateway_minus_forwarder_p50_ms"] <= MAX_ADDED_P50_MS
            )
    if g and d:
        ratios["gateway_vs_direct_rps"] = g.rps / d.rps
        if g.latency and d.latency:
            added["gateway_minus_direct_p50_ms"] = g.p50_ms - d.p50_ms
            checks["added_p50_vs_direct_ok"] = (
                added["gateway_minus_direct_p50_ms"] <= MAX_ADDED_P50_MS
            )
    if f and d:
        ratios["forwarder_vs_direct_rps"] = f.rps / d.rps
        if f.latency and d.latency:
            added["forwarder_minus_direct_p50_ms"] = f.p50_ms - d.p50_ms
    per_round = {
        f"{a}_vs_{b}": round_ratios(results[a], results[b])
        for a, b in ROUND_PAIRS
        if a in results and b in results
    }
    # A verdict from runs with errors (or a dead server) means nothing.
    valid = not any(r.has_errors for r in results.values())
    return {
        "ratios": ratios,
        "per_round": per_round,
        "added_latency_ms": added,
        "checks": checks,
        "checks_valid": valid,
    }


def per_round_lines(summary: dict[str, Any]) -> list[str]:
    """One line per compared pair: median and range of the round-by-round ratios."""
    lines = []
    for key, r in summary.get("per_round", {}).items():
        num, _, den = key.partition("_vs_")
        label = f"{TARGET_LABELS[num]} / {TARGET_LABELS[den]}"
        parts = []
        for name, field_ in (("rps", "rps"), ("CPU per request", "cpu_per_req")):
            if f"{field_}_median" in r:
                rounds = " ".join(f"{v:.2f}" for v in r[field_])
                parts.append(
                    f"{name} {r[f'{field_}_median']:.2f}x "
                    f"[{r[f'{field_}_min']:.2f}-{r[f'{field_}_max']:.2f}] ({rounds})"
                )
        lines.append(f"{label}, per round: " + "; ".join(parts))
    return lines


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}us"


def _verdict(ok: bool | None, valid: bool) -> str:
    if ok is None:
        return ""
    if not valid:
        return "INVALID (runs had errors)"
    return "PASS" if ok else "FAIL"


def text_report(
    results: dict[str, TargetResults], summary: dict[str, Any], connections: int
) -> str:
    lines = []
    header = (
        f"{'target':<16} {f'rps c={connections}':>11} {'CPU/req':>9} {'p50 c=1':>9} "
        f"{'p99 c=1':>9}  {'rps per round':<22} errors"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for name, res in results.items():
        rounds = "/".join(f"{r.rps:.0f}" for r in res.throughput)
        errors = res.error_summary() if res.has_errors else "none"
        lines.append(
            f"{TARGET_LABELS[name]:<16} {res.rps:>11.0f} {_us(res.cpu_us):>9} "
            f"{res.p50_ms:>7.3f}ms {res.p99_ms:>7.3f}ms  {rounds:<22} {errors}"
        )
    lines.append("")
    ratios, added, checks = summary["ratios"], summary["added_latency_ms"], summary["checks"]
    valid: bool = summary["checks_valid"]
    rows: list[tuple[str, str, str]] = []
    if "gateway_vs_forwarder_rps" in ratios:
        rows.append(
            (
                "gateway / forwarder rps",
                f"{ratios['gateway_vs_forwarder_rps']:.2f}x",
                f">= {MIN_RPS_RATIO_VS_FORWARDER}x "
                f"{_verdict(checks.get('rps_ratio_vs_forwarder_ok'), valid)}",
            )
        )
    if "gateway_vs_forwarder_cpu_per_req" in ratios:
        rows.append(
            (
                "gateway / forwarder CPU per request",
                f"{ratios['gateway_vs_forwarder_cpu_per_req']:.2f}x",
                "(less noisy cross-check of the rps ratio)",
            )
        )
    if "gateway_vs_direct_rps" in ratios:
        rows.append(("gateway / direct rps", f"{ratios['gateway_vs_direct_rps']:.2f}x", ""))
    if "forwarder_vs_direct_rps" in ratios:
        rows.append(("forwarder / direct rps", f"{ratios['forwarder_vs_direct_rps']:.2f}x", ""))
    if "gateway_minus_direct_p50_ms" in added:
        rows.append(
            (
                "added p50 c=1: gateway - direct",
                f"{added['gateway_minus_direct_p50_ms']:+.3f} ms",
                f"<= {MAX_ADDED_P50_MS} ms {_verdict(checks.get('added_p50_vs_direct_ok'), valid)}",
            )
        )
    if "forwarder_minus_direct_p50_ms" in added:
        rows.append(
            (
                "added p50 c=1: forwarder - direct",
                f"{added['forwarder_minus_direct_p50_ms']:+.3f} ms",
                "",
            )
        )
    if "gateway_minus_forwarder_p50_ms" in added:
        rows.append(
            (
                "added p50 c=1: gateway - forwarder",
                f"{added['gateway_minus_forwarder_p50_ms']:+.3f} ms",
                f"<= {MAX_ADDED_P50_MS} ms "
                f"{_verdict(checks.get('added_p50_vs_forwarder_ok'), valid)}",
            )
        )
    for label, value, target in rows:
        lines.append(f"{label:<36} {value:>10}   {target}".rstrip())
    per_round = per_round_lines(summary)
    if per_round:
        lines.append("")
        lines += per_round
    return "\n".join(lines)


def _run_quiet(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (proc.stdout or proc.stderr).strip()


def machine_info(wrk: str) -> dict[str, Any]:
    versions: dict[str, str] = {}
    for mod in ("aiohttp", "uvloop"):
        with contextlib.suppress(PackageNotFoundError):
            versions[mod] = version(mod)
    wrk_version = _run_quiet([wrk, "-v"]).splitlines()
    git_rev = git_head()
    return {
        "arch": platform.machine(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model("unknown"),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "packages": versions,
        "wrk": wrk_version[0].split(" Copyright")[0] if wrk_version else "unknown",
        "git": (git_rev or "no commit") + (" (dirty)" if git_dirty() else ""),
    }


def markdown_report(
    results: dict[str, TargetResults],
    summary: dict[str, Any],
    meta: dict[str, Any],
) -> str:
    m = meta["machine"]
    p = meta["params"]
    pkgs = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    out = [
        f"### Overhead run {meta['date']}",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {m['arch']}, nproc={m['nproc']}, {m['cpu_model']}, Python {m['python']}, "
        f"{pkgs}, {m['wrk']}, kernel {m['kernel']}, git {m['git']}",
        "",
        f"Load: wrk -t1, throughput at c={p['connections']}, "
        f"{'latency at c=1' if p['latency_runs'] else 'no c=1 latency runs'}, "
        f"{p['duration']} s per run, {p['warmup']} s warm-up, median of {p['rounds']} rounds "
        "(alternating order). Request: POST /v1/chat/completions, small JSON body.",
        "",
        f"| target | rps c={p['connections']} | server CPU/req c={p['connections']} (us) "
        "| p50 c=1 (ms) | p99 c=1 (ms) | rps c=1 | rps per round | errors |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, res in results.items():
        rounds = " / ".join(f"{r.rps:.0f}" for r in res.throughput)
        errors = f"**{res.error_summary()}**" if res.has_errors else "none"
        out.append(
            f"| {TARGET_LABELS[name]} | {res.rps:.0f} | {_us(res.cpu_us).removesuffix('us')} "
            f"| {res.p50_ms:.3f} | {res.p99_ms:.3f} | {res.c1_rps:.0f} | {rounds} | {errors} |"
        )
    ratios, added, checks = summary["ratios"], summary["added_latency_ms"], summary["checks"]
    valid: bool = summary["checks_valid"]
    out += ["", "| comparison | value | target |", "|---|---:|---|"]
    if "gateway_vs_forwarder_rps" in ratios:
        out.append(
            f"| gateway / forwarder rps | {ratios['gateway_vs_forwarder_rps']:.2f}x "
            f"| >= {MIN_RPS_RATIO_VS_FORWARDER}x "
            f"{_verdict(checks.get('rps_ratio_vs_forwarder_ok'), valid)} |"
        )
    if "gateway_vs_forwarder_cpu_per_req" in ratios:
        out.append(
            "| gateway / forwarder server CPU per request "
            f"| {ratios['gateway_vs_forwarder_cpu_per_req']:.2f}x "
            "| (cross-check, lower is better) |"
        )
    if "gateway_vs_direct_rps" in ratios:
        out.append(f"| gateway / direct rps | {ratios['gateway_vs_direct_rps']:.2f}x | |")
    if "forwarder_vs_direct_rps" in ratios:
        out.append(f"| forwarder / direct rps | {ratios['forwarder_vs_direct_rps']:.2f}x | |")
    if "gateway_minus_direct_p50_ms" in added:
        out.append(
            f"| added p50 c=1, gateway - direct | {added['gateway_minus_direct_p50_ms']:+.3f} ms "
            f"| <= {MAX_ADDED_P50_MS} ms {_verdict(checks.get('added_p50_vs_direct_ok'), valid)} |"
        )
    if "forwarder_minus_direct_p50_ms" in added:
        out.append(
            f"| added p50 c=1, forwarder - direct "
            f"| {added['forwarder_minus_direct_p50_ms']:+.3f} ms | |"
        )
    if "gateway_minus_forwarder_p50_ms" in added:
        out.append(
            f"| added p50 c=1, gateway - forwarder "
            f"| {added['gateway_minus_forwarder_p50_ms']:+.3f} ms "
            f"| <= {MAX_ADDED_P50_MS} ms "
            f"{_verdict(checks.get('added_p50_vs_forwarder_ok'), valid)} |"
        )
    per_round = per_round_lines(summary)
    if per_round:
        out.append("")
        out += [f"- {line}" for line in per_round]
    if meta.get("gateway_cmd_override"):
        out += ["", f"Note: gateway slot overridden with `{meta['gateway_cmd_override']}`."]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser(
        "Measure the gateway's overhead against a bare aiohttp forwarder and the upstream "
        "itself, with wrk."
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (10)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up seconds per target (2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, median reported (3)")
    parser.add_argument("--connections", type=int, default=32, help="throughput connections")
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"comma-separated subset of {','.join(TARGETS)}",
    )
    parser.add_argument("--model", default="bench-model")
    cli.add_gateway_args(parser)
    parser.add_argument(
        "--base-config",
        type=Path,
        help="gateway config to start from instead of the EPP's default scorers, e.g. "
        "config/recommended.yaml (its endpoints are replaced by the bench upstream)",
    )
    parser.add_argument(
        "--config-extra", type=Path, help="YAML merged into the gateway config (see merge_config)"
    )
    parser.add_argument("--startup-timeout", type=float, default=60.0)
    parser.add_argument("--wrk-timeout", type=int, default=5, help="wrk per-request timeout (s)")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also measure the gateway from the code in DIR (run with PYTHONPATH=DIR), "
        "interleaved with the others; e.g. DIR from `git archive main heimdall_proxy`",
    )
    parser.add_argument(
        "--no-latency",
        action="store_true",
        help="skip the c=1 latency runs (throughput and CPU per request only; half the time)",
    )
    cli.add_output(parser)
    parser.add_argument("--keep-tmp", action="store_true", help="keep logs/config/lua temp dir")
    # Dev only: replace the gateway command line; placeholders {port} {config} {upstream}
    # {python}. E.g. "{python} -m bench.harness.bare_forwarder --port {port} --upstream {upstream}".
    parser.add_argument("--gateway-cmd", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        parser.error(f"--targets: unknown {unknown}; choose from {','.join(TARGETS)}")
    if args.baseline is not None:
        if not (args.baseline / "heimdall_proxy").is_dir():
            parser.error(f"--baseline: no heimdall_proxy package in {args.baseline}")
        args.baseline = args.baseline.resolve()
        targets.append("baseline")
    elif "baseline" in targets:
        parser.error("--targets baseline needs --baseline DIR")
    args.target_list = [t for t in TARGETS if t in targets]
    if args.duration < 1 or args.rounds < 1 or args.warmup < 0 or args.connections < 1:
        parser.error("--duration/--rounds/--connections must be >= 1 and --warmup >= 0")
    if args.base_config is not None and not args.base_config.is_file():
        parser.error(f"--base-config: no such file {args.base_config}")
    if args.config_extra is not None and not args.config_extra.is_file():
        parser.error(f"--config-extra: no such file {args.config_extra}")
    return args


def _raise_on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise HarnessError(
            "wrk not found on PATH. Install it first, e.g. `apt-get install -y wrk` "
            "(Debian/Ubuntu) or `brew install wrk`."
        )
    workdir = Path(tempfile.mkdtemp(prefix="heimdall-overhead-"))
    servers: list[Proc] = []
    failed = True
    try:
        up_port, fw_port, gw_port, base_port = free_ports(4)
        upstream_url = f"http://127.0.0.1:{up_port}"
        chat = {
            "model": args.model,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "max_tokens": 16,
        }
        chat_body = json.dumps(chat, separators=(",", ":"))
        lua = workdir / "chat.lua"
        lua.write_text(LUA_TEMPLATE.format(body=chat_body))

        config_path = workdir / "gateway.yaml"
        config = build_gateway_config(upstream_url, args.config_extra, args.base_config)
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))

        upstream = start_server(
            "upstream",
            fast_upstream_argv(up_port, args.model),
            workdir,
        )
        servers.append(upstream)
        deadline = time.monotonic() + args.startup_timeout
        wait_ready(upstream, f"{upstream_url}/health", "health", deadline)

        urls: dict[str, str] = {"direct": upstream_url}
        pgids: dict[str, int] = {"direct": upstream.pid}
        ready: list[tuple[Proc, str]] = [(upstream, upstream_url)]
        if "forwarder" in args.target_list:
            fw = start_server(
                "forwarder",
                bare_forwarder_argv(fw_port, upstream_url),
                workdir,
            )
            servers.append(fw)
            urls["forwarder"] = f"http://127.0.0.1:{fw_port}"
            pgids["forwarder"] = fw.pid
            ready.append((fw, urls["forwarder"]))
        if "gateway" in args.target_list:
            gw = start_server(
                "gateway", gateway_argv(args, gw_port, config_path, upstream_url), workdir
            )
            servers.append(gw)
            urls["gateway"] = f"http://127.0.0.1:{gw_port}"
            pgids["gateway"] = gw.pid
            ready.append((gw, urls["gateway"]))
        if "baseline" in args.target_list:
            bl = start_server("baseline", baseline_argv(args, base_port, config_path), workdir)
            servers.append(bl)
            urls["baseline"] = f"http://127.0.0.1:{base_port}"
            pgids["baseline"] = bl.pid
            ready.append((bl, urls["baseline"]))

        for server, base in ready[1:]:
            progress(f"waiting for {server.name}: {shlex.join(server.argv)}")
            wait_ready(server, f"{base}/v1/models", "models", deadline)
        # Every target must serve the exact request we load it with before we measure it.
        for server, base in ready:
            wait_ready(
                server,
                f"{base}/v1/chat/completions",
                "chat",
                deadline,
                chat_body=chat_body.encode(),
            )
        progress("all targets ready; logs and config in " + str(workdir))

        results = {t: TargetResults(t, urls[t] + "/v1/chat/completions") for t in args.target_list}
        for rnd in range(args.rounds):
            order = args.target_list if rnd % 2 == 0 else list(reversed(args.target_list))
            for t in order:
                res = results[t]
                if args.warmup:
                    run_wrk(
                        wrk,
                        res.url,
                        lua,
                        connections=args.connections,
                        duration=args.warmup,
                        timeout_s=args.wrk_timeout,
                    )
                pgid = pgids[t]
                tp = measure(
                    wrk,
                    res.url,
                    lua,
                    connections=args.connections,
                    duration=args.duration,
                    timeout_s=args.wrk_timeout,
                    server_pgid=pgid,
                    upstream_pgid=upstream.pid,
                )
                res.throughput.append(tp)
                line = (
                    f"[round {rnd + 1}/{args.rounds}] {TARGET_LABELS[t]:<16} "
                    f"{tp.rps:8.0f} rps, {_us(tp.cpu_us_per_req)} CPU/req (c={args.connections})"
                )
                flag = (
                    f"  ERRORS: c={args.connections}: {tp.error_summary()}" if tp.has_errors else ""
                )
                if not args.no_latency:
                    lat = measure(
                        wrk,
                        res.url,
                        lua,
                        connections=1,
                        duration=args.duration,
                        timeout_s=args.wrk_timeout,
                        server_pgid=pgid,
                        upstream_pgid=upstream.pid,
                    )
                    res.latency.append(lat)
                    line += f"   p50 {lat.p50_ms:.3f} ms  p99 {lat.p99_ms:.3f} ms (c=1)"
                    if lat.has_errors:
                        flag += f"  ERRORS: c=1: {lat.error_summary()}"
                progress(line + flag)
            # Every server must have survived the round.
            for server in servers:
                if server.popen.poll() is not None:
                    raise HarnessError(
                        f"{server.name} exited with code {server.popen.returncode} during the "
                        f"run.\n--- last lines of {server.log_path} ---\n{server.tail(40)}"
                    )

        summary = compute_summary(results)
        any_errors = any(r.has_errors for r in results.values())
        meta: dict[str, Any] = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": shlex.join(["python", *sys.argv]),
            "machine": machine_info(wrk),
            "params": {
                "duration": args.duration,
                "warmup": args.warmup,
                "rounds": args.rounds,
                "connections": args.connections,
                "targets": args.target_list,
                "model": args.model,
                "request_body": chat,
                "gateway_argv": next((s.argv for s in servers if s.name == "gateway"), None),
                "baseline": str(args.baseline) if args.baseline else None,
                "latency_runs": not args.no_latency,
                "gateway_config": config
                if {"gateway", "baseline"} & set(args.target_list)
                else None,
            },
            "gateway_cmd_override": args.gateway_cmd,
        }

        print()
        print(text_report(results, summary, args.connections))
        if any_errors:
            print()
            print("WARNING: some runs had errors; their numbers are not trustworthy:")
            for name, res in results.items():
                if res.has_errors:
                    print(f"  {TARGET_LABELS[name]}: {res.error_summary()}")
        if args.markdown:
            print()
            cli.write_markdown(args.markdown, markdown_report(results, summary, meta))
        if args.json:
            payload = {
                **meta,
                "targets": {name: res.to_dict() for name, res in results.items()},
                **summary,
                "targets_thresholds": {
                    "min_rps_ratio_vs_forwarder": MIN_RPS_RATIO_VS_FORWARDER,
                    "max_added_p50_ms": MAX_ADDED_P50_MS,
                },
                "has_errors": any_errors,
            }
            cli.write_json(args.json, payload)
        failed = any_errors
        return 2 if any_errors else 0
    finally:
        stop_servers(servers)
        if failed or args.keep_tmp:
            progress(f"logs, config and wrk script kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_harness(body: Callable[[], int]) -> int:
    """Run a bench's `body` as a command: SIGTERM and SIGHUP unwind like Ctrl-C (so the
    servers it started are stopped by its own `finally`), a HarnessError is one line on
    stderr and exit 1, an interrupt exit 130."""
    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGHUP, _raise_on_signal)
    try:
        return body()
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_harness(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
