"""Cost per request counted, not timed: instructions (callgrind) and calls (cProfile).

bench/overhead.py's throughput and CPU ratios swing by 3x with the machine's load (two shared
cores, other benches running), which hides any change of a few microseconds. This bench counts
instead. Each server under test (the bare aiohttp forwarder, the gateway, and with `--baseline
DIR` the gateway from another copy of the code) runs under `valgrind --tool=callgrind` in front
of the same `bench/harness/fast_upstream.py` (run natively). After a warm-up the bench reads
the server's instruction counter (`callgrind_control -e Ir`) over a short idle window (its rate
per second), then over `--repeat` windows of `--requests` requests (the body of
bench/overhead.py) sent on `--connections` keep-alive connections; instructions per request =
(window - idle rate x its length) / requests. Instruction counts do not depend on the machine's
load: repeats agree within about 1%. With more than one connection requests overlap as under
wrk, so what only concurrency costs (the collector walking the requests in flight) is counted
too.

`--calls` counts calls the same way, with the servers run under bench/probes/callcount.py
(cProfile switched on and off by signals): Python functions and the builtins they call, per
request, with aiohttp's share and the functions whose counts differ most between two targets.

The servers run with PYTHONHASHSEED=0, and the gateway's background work (metrics, models and
health scrapes, every 0.1-5 s by default) is set to once a minute: it is a cost per second,
not per request (issue 17 item 1 measures it), and its cadence follows the traffic, so an
idle window could not subtract it. `--keep-background` leaves the defaults.

Run: `python -m bench.probes.instructions [--requests 320] [--repeat 2]
[--connections 16] [--calls] [--base-config config/recommended.yaml] [--baseline DIR]
[--json OUT] [--markdown]`
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import pstats
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.harness import cli
from bench.harness.gateway import serve_args
from bench.harness.machine import REPO_ROOT, cpu_model, git_dirty, git_head
from bench.harness.pods import fast_upstream_argv
from bench.harness.procs import (
    HarnessError,
    Proc,
    free_ports,
    start_server,
    stop_servers,
    wait_ready,
)
from bench.overhead import build_gateway_config, run_harness

TARGETS = ("forwarder", "gateway", "baseline")
LABELS = {"forwarder": "bare forwarder", "gateway": "gateway", "baseline": "gateway baseline"}
QUIET_BACKGROUND = (
    "--metrics-interval 60s --idle-metrics-interval 60s --models-interval 60s --health-interval 60s"
)
TH_RE = re.compile(r"^\s*Th\s+\d+\s+([\d,]+)", re.MULTILINE)
CHAT = {
    "model": "bench-model",
    "messages": [{"role": "user", "content": "Say hello in five words."}],
    "max_tokens": 16,
}


@dataclass
class Window:
    """One measured window: the count over `requests` requests, and the idle count (the
    idle rate times the window's length) taken off it."""

    requests: int
    load: float
    seconds: float
    idle: float

    @property
    def per_request(self) -> float:
        return (self.load - self.idle) / self.requests


@dataclass
class TargetCount:
    name: str
    windows: list[Window] = field(default_factory=list)
    #: --calls: per function (file:line(name)), calls per request over all windows
    functions: dict[str, float] = field(default_factory=dict)

    @property
    def per_request(self) -> float:
        return statistics.median(w.per_request for w in self.windows)


# --------------------------------------------------------------------------------------------
# load


class Client:
    """`connections` keep-alive connections, each sending its share of the requests one after
    another (one thread each); every answer must be a 200. With more than one, requests
    overlap in the server as under wrk, so what only concurrency costs (the collector
    walking the objects of the requests in flight) is counted too."""

    def __init__(self, port: int, connections: int = 1) -> None:
        self.conns = [
            http.client.HTTPConnection("127.0.0.1", port, timeout=300) for _ in range(connections)
        ]
        self.body = json.dumps(CHAT, separators=(",", ":")).encode()
        self.pool = ThreadPoolExecutor(max_workers=connections)

    def _send(self, conn: http.client.HTTPConnection, n: int) -> None:
        for _ in range(n):
            conn.request(
                "POST", "/v1/chat/completions", self.body, {"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise HarnessError(f"answer {resp.status}: {data[:300]!r}")

    def send(self, n: int) -> float:
        """Sends `n` requests (rounded down to a multiple of the connections); returns the
        seconds they took."""
        share = max(1, n // len(self.conns))
        t0 = time.monotonic()
        for future in [self.pool.submit(self._send, c, share) for c in self.conns]:
            future.result()
        return time.monotonic() - t0

    def requests(self, n: int) -> int:
        return max(1, n // len(self.conns)) * len(self.conns)

    def close(self) -> None:
        self.pool.shutdown()
        for conn in self.conns:
            conn.close()


# --------------------------------------------------------------------------------------------
# counters


class Meter:
    """Counts what a running server does between `start` and `stop`."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> tuple[float, dict[str, float]]:
        """The count since `start`, and per function where the meter knows it."""
        raise NotImplementedError


class Instructions(Meter):
    """The instructions callgrind counts in process `pid`, over all its threads."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = 0.0

    def read(self) -> float:
        proc = subprocess.run(
            ["callgrind_control", "-e", "Ir", str(self.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        counts = TH_RE.findall(proc.stdout)
        if not counts:
            raise HarnessError(f"callgrind_control gave no counts:\n{proc.stdout}{proc.stderr}")
        return float(sum(int(c.replace(",", "")) for c in counts))

    def start(self) -> None:
        self.before = self.read()

    def stop(self) -> tuple[float, dict[str, float]]:
        return self.read() - self.before, {}


class Calls(Meter):
    """The calls cProfile counts in process `pid` (run under bench/probes/callcount.py): SIGUSR1
    starts a profile, SIGUSR2 writes it out."""

    def __init__(self, pid: int, prefix: str) -> None:
        self.pid = pid
        self.prefix = prefix
        self.dumps = 0

    def start(self) -> None:
        os.kill(self.pid, signal.SIGUSR1)
        time.sleep(0.3)  # the handler runs when the server's loop next wakes

    def stop(self) -> tuple[float, dict[str, float]]:
        os.kill(self.pid, signal.SIGUSR2)
        self.dumps += 1
        path = Path(f"{self.prefix}.{self.dumps}.prof")
        deadline = time.monotonic() + 60
        while not path.exists():
            if time.monotonic() > deadline:
                raise HarnessError(f"no profile at {path}")
            time.sleep(0.1)
        stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
        per_fn: Counter[str] = Counter()
        for (file, line, fn), (_, ncalls, *_rest) in stats.items():
            per_fn[f"{_short(file)}:{line}({ADDRESS_RE.sub('', fn)})"] += ncalls
        return float(sum(per_fn.values())), dict(per_fn)


def measure_idle(meter: Meter, seconds: float) -> tuple[float, dict[str, float]]:
    """The count per second without requests, in total and per function. The window is
    shorter than the upstream connections' keep-alive (4 s), so it does not count their
    closing (nor the next window their reopening)."""
    meter.start()
    t0 = time.monotonic()
    time.sleep(seconds)
    total, per_fn = meter.stop()
    elapsed = time.monotonic() - t0
    return total / elapsed, {k: v / elapsed for k, v in per_fn.items()}


def measure_window(
    meter: Meter, client: Client, n: int, idle: tuple[float, dict[str, float]]
) -> tuple[Window, dict[str, float]]:
    """Counts over `n` requests, less the idle rate over as long."""
    n = client.requests(n)
    meter.start()
    seconds = client.send(n)
    total, load_fn = meter.stop()
    rate, idle_fn = idle
    per_fn = {k: (v - idle_fn.get(k, 0.0) * seconds) / n for k, v in load_fn.items()}
    return Window(n, total, seconds, rate * seconds), per_fn


# --------------------------------------------------------------------------------------------
# servers


def server_argv(
    args: argparse.Namespace, target: str, port: int, upstream: str, config: Path, prefix: str
) -> list[str]:
    # `-P` with an explicit path: the baseline's package (when asked) before this checkout's,
    # which also holds `bench` for the modules run with -m.
    path = f"{args.baseline}:{REPO_ROOT}" if target == "baseline" else str(REPO_ROOT)
    env = ["env", "PYTHONHASHSEED=0", f"PYTHONPATH={path}"]
    if args.calls:
        wrap = [sys.executable, "-P", "-m", "bench.probes.callcount", prefix]
    else:
        wrap = [
            "valgrind",
            "--tool=callgrind",
            "-q",
            f"--callgrind-out-file={prefix}.callgrind",
            sys.executable,
            "-P",
        ]
    if target == "forwarder":
        program = [
            "-m",
            "bench.harness.bare_forwarder",
            "--port",
            str(port),
            "--upstream",
            upstream,
        ]
    else:
        background = "" if args.keep_background else QUIET_BACKGROUND
        # the gateway's serve arguments, with the background work quietened before its own
        extra = shlex.split(f"{background} {args.gateway_args}")
        program = ["-m", "heimdall_proxy", *serve_args(config, port, extra)]
    return [*env, *wrap, *program]


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.calls and shutil.which("valgrind") is None:
        raise HarnessError("valgrind not found on PATH (apt-get install -y valgrind)")
    workdir = Path(tempfile.mkdtemp(prefix="heimdall-instructions-"))
    servers: list[Proc] = []
    results: dict[str, TargetCount] = {}
    try:
        up_port, *ports = free_ports(1 + len(TARGETS))
        upstream_url = f"http://127.0.0.1:{up_port}"
        upstream = start_server(
            "upstream",
            fast_upstream_argv(up_port),
            workdir,
        )
        servers.append(upstream)
        wait_ready(upstream, f"{upstream_url}/health", "health", time.monotonic() + 60)
        config_path = workdir / "gateway.yaml"
        config = build_gateway_config(upstream_url, args.config_extra, args.base_config)
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        chat_body = json.dumps(CHAT, separators=(",", ":")).encode()
        for target, port in zip(args.target_list, ports, strict=False):
            prefix = str(workdir / target)
            argv = server_argv(args, target, port, upstream_url, config_path, prefix)
            progress(f"{target}: {shlex.join(argv)}")
            server = start_server(target, argv, workdir)
            servers.append(server)
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + args.startup_timeout
            wait_ready(server, f"{base}/v1/chat/completions", "chat", deadline, chat_body)
            meter: Meter = (
                Calls(server.popen.pid, prefix) if args.calls else Instructions(server.popen.pid)
            )
            client = Client(port, args.connections)
            try:
                client.send(args.warmup)
                res = results[target] = TargetCount(target)
                totals: Counter[str] = Counter()
                idle = measure_idle(meter, args.idle_seconds)
                for i in range(args.repeat):
                    window, per_fn = measure_window(meter, client, args.requests, idle)
                    res.windows.append(window)
                    totals.update(per_fn)
                    progress(
                        f"  {target} window {i + 1}: {window.per_request:,.0f} "
                        f"{'calls' if args.calls else 'instructions'} per request "
                        f"({window.requests} requests in {window.seconds:.1f} s, idle count "
                        f"{window.idle:,.0f} taken off)"
                    )
                res.functions = {k: v / args.repeat for k, v in totals.items()}
            finally:
                client.close()
            stop_servers([server])
            servers.remove(server)
        return summarise(args, results, config)
    finally:
        stop_servers(servers)
        if args.keep_tmp:
            progress(f"logs and counts kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# report


def summarise(
    args: argparse.Namespace, results: dict[str, TargetCount], config: dict[str, Any]
) -> dict[str, Any]:
    unit = "calls" if args.calls else "instructions"
    out: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(["python", *sys.argv]),
        "unit": unit,
        "machine": {
            "arch": platform.machine(),
            "cpu_model": cpu_model("unknown"),
            "python": platform.python_version(),
            "git": (git_head() or "no commit") + (" (dirty)" if git_dirty() else ""),
        },
        "params": {
            "requests": args.requests,
            "repeat": args.repeat,
            "warmup": args.warmup,
            "connections": args.connections,
            "baseline": str(args.baseline) if args.baseline else None,
            "keep_background": args.keep_background,
            "gateway_config": config,
        },
        "targets": {},
        "ratios": {},
    }
    for name, res in results.items():
        entry: dict[str, Any] = {
            "per_request": res.per_request,
            "windows": [w.per_request for w in res.windows],
        }
        if args.calls:
            aiohttp_calls = sum(v for k, v in res.functions.items() if _is_aiohttp(k))
            builtin = sum(v for k, v in res.functions.items() if k.startswith("~:0("))
            entry["aiohttp"] = aiohttp_calls
            entry["builtins"] = builtin
            entry["top"] = sorted(res.functions.items(), key=lambda kv: -kv[1])[: args.top]
        out["targets"][name] = entry
    for num, den in (("gateway", "forwarder"), ("baseline", "forwarder"), ("gateway", "baseline")):
        if num in results and den in results:
            out["ratios"][f"{num}/{den}"] = results[num].per_request / results[den].per_request
    if args.calls and "gateway" in results:
        other = "baseline" if "baseline" in results else "forwarder"
        if other in results:
            a, b = results["gateway"].functions, results[other].functions
            diff = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in set(a) | set(b)}
            out["diff_vs_" + other] = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[: args.top]
    return out


def _is_aiohttp(key: str) -> bool:
    return key.startswith("aiohttp/")


def _short(key: str) -> str:
    """A source file's path from its package on (site-packages, the gateway's package, the
    standard library), so that two copies of the gateway's code compare function by
    function."""
    for marker in ("/site-packages/", "/heimdall_proxy/"):
        if marker in key:
            return key.split(marker, 1)[1]
    return STDLIB_RE.sub("", key)


STDLIB_RE = re.compile(r"^.*/lib/python3\.\d+/")
#: "<built-in method __new__ of type object at 0x7f...>": the address differs per process
ADDRESS_RE = re.compile(r" at 0x[0-9a-f]+")


def text_report(out: dict[str, Any]) -> str:
    unit = out["unit"]
    lines = [f"{'target':<18} {unit + ' per request':>26}  windows"]
    for name, t in out["targets"].items():
        windows = " / ".join(f"{w:,.0f}" for w in t["windows"])
        extra = ""
        if "aiohttp" in t:
            extra = f"  (aiohttp {t['aiohttp']:.0f}, builtins {t['builtins']:.0f})"
        lines.append(f"{LABELS[name]:<18} {t['per_request']:>26,.0f}  {windows}{extra}")
    for pair, ratio in out["ratios"].items():
        lines.append(f"{pair:<18} {ratio:>25.3f}x")
    for key in ("diff_vs_forwarder", "diff_vs_baseline"):
        if key in out:
            lines.append("")
            lines.append(f"calls per request, gateway minus {key.removeprefix('diff_vs_')}:")
            lines += [f"  {v:+8.1f}  {k}" for k, v in out[key]]
    return "\n".join(lines)


def markdown_report(out: dict[str, Any]) -> str:
    unit = out["unit"]
    m = out["machine"]
    rows = [
        f"Command: `{out['command']}` ({out['date']}; {m['arch']}, {m['cpu_model']}, "
        f"Python {m['python']}, git {m['git']})",
        "",
        f"| target | {unit} per request | windows |",
        "|---|---:|---|",
    ]
    for name, t in out["targets"].items():
        windows = " / ".join(f"{w:,.0f}" for w in t["windows"])
        rows.append(f"| {LABELS[name]} | {t['per_request']:,.0f} | {windows} |")
    for pair, ratio in out["ratios"].items():
        rows.append(f"| {pair} | {ratio:.3f}x | |")
    return "\n".join(rows)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser(__doc__)
    p.add_argument("--requests", type=int, default=320, help="requests per window (320)")
    p.add_argument("--repeat", type=int, default=2, help="windows per target, median (2)")
    p.add_argument("--warmup", type=int, default=100, help="requests before counting (100)")
    p.add_argument(
        "--idle-seconds", type=float, default=2.0, help="idle window after the warm-up (2)"
    )
    p.add_argument(
        "--connections", type=int, default=16, help="concurrent keep-alive connections (16)"
    )
    p.add_argument("--targets", default="forwarder,gateway", help="of forwarder,gateway")
    p.add_argument("--baseline", type=Path, metavar="DIR", help="also the gateway from DIR")
    p.add_argument("--calls", action="store_true", help="count calls (cProfile), not instructions")
    p.add_argument("--top", type=int, default=40, help="--calls: functions listed (40)")
    p.add_argument("--base-config", type=Path, help="whole gateway config, e.g. recommended.yaml")
    p.add_argument("--config-extra", type=Path, help="YAML merged into the gateway config")
    cli.add_gateway_args(p)
    p.add_argument(
        "--keep-background",
        action="store_true",
        help="keep the gateway's default scrape intervals (their cost is then in the counts)",
    )
    p.add_argument("--startup-timeout", type=float, default=600.0)
    cli.add_output(p)
    p.add_argument("--keep-tmp", action="store_true")
    args = p.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if set(targets) - {"forwarder", "gateway"}:
        p.error("--targets: choose from forwarder,gateway (add --baseline DIR for the third)")
    if args.baseline is not None:
        if not (args.baseline / "heimdall_proxy").is_dir():
            p.error(f"--baseline: no heimdall_proxy package in {args.baseline}")
        args.baseline = args.baseline.resolve()
        targets.append("baseline")
    args.target_list = [t for t in TARGETS if t in targets]
    if args.requests < 1 or args.repeat < 1 or args.warmup < 0 or args.connections < 1:
        p.error("--requests/--repeat/--connections must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_harness(lambda: report(args, run(args)))


def report(args: argparse.Namespace, out: dict[str, Any]) -> int:
    print(text_report(out))
    if args.markdown:
        print()
        cli.write_markdown(args.markdown, markdown_report(out))
    cli.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
