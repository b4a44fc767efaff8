"""What scraping costs an idle gateway: CPU share at N pods serving real-vLLM-sized pages.

A page server (one subprocess, one aiohttp listener per pod port) serves every pod's
`/metrics` (the real vLLM 0.32 page in tests/datalayer/fixtures, ~50 kB, 369 samples),
`/v1/models` and `/health`, and records when each pod was scraped. A gateway
(`heimdall-proxy serve` on a copy of the config with these pods as endpoints) runs with no
requests at all; the script reads the gateway's user + system CPU time from /proc over a
window, and from the page server the scrape rate and the longest gap between two scrapes of
one pod (the age a pod's numbers can reach). `--busy K` makes the first K pods report a
running request, so they stay on the busy cadence.

    python -m bench.scrape --pods 16,64,256 --config config/recommended.yaml
    python -m bench.scrape --pods 64 --gateway-args "--idle-metrics-interval 100ms"

To measure an older checkout, put it first on PYTHONPATH (its `heimdall_proxy` is then the
one the gateway subprocess imports; the script prints which one ran)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench.harness import cli
from bench.harness.machine import REPO_ROOT, cpu_model, git_head
from bench.harness.procs import bench_module

PAGE = REPO_ROOT / "tests" / "datalayer" / "fixtures" / "vllm_metrics_real.txt"
HOST = "127.0.0.1"
CLK = os.sysconf("SC_CLK_TCK")


# ---- the page server (runs as `scrape.py serve`) ---------------------------------------------


async def _serve(base_port: int, pods: int, busy: int, ready: str) -> None:
    from aiohttp import web

    page = PAGE.read_bytes()
    # A busy pod: one request running (the fixture's running gauge set to 1).
    lines = page.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"vllm:num_requests_running{"):
            lines[i] = line.rsplit(b" ", 1)[0] + b" 1.0"
    busy_page = b"\n".join(lines)
    idle_lines = page.split(b"\n")
    for i, line in enumerate(idle_lines):
        if line.startswith((b"vllm:num_requests_running{", b"vllm:num_requests_waiting{")):
            idle_lines[i] = line.rsplit(b" ", 1)[0] + b" 0.0"
    idle_page = b"\n".join(idle_lines)
    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
    scrapes: dict[int, list[float]] = {i: [] for i in range(pods)}

    def handler(i: int) -> Any:
        body = busy_page if i < busy else idle_page

        async def metrics(_: web.Request) -> web.Response:
            scrapes[i].append(time.monotonic())
            return web.Response(body=body, content_type="text/plain")

        return metrics

    async def models_route(_: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def stats(request: web.Request) -> web.Response:
        since = float(request.query.get("since", "0"))
        out = {str(i): [t for t in ts if t >= since] for i, ts in scrapes.items()}
        return web.json_response({"now": time.monotonic(), "scrapes": out})

    runners = []
    for i in range(pods):
        app = web.Application()
        app.router.add_get("/metrics", handler(i))
        app.router.add_get("/v1/models", models_route)
        app.router.add_get("/health", health)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, HOST, base_port + i).start()
        runners.append(runner)
    await asyncio.to_thread(Path(ready).write_text, "ok")
    await asyncio.Event().wait()


# ---- the driver -----------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime, stime


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _wait(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def _free_base(n: int) -> int:
    """A run of n free ports (probed by binding each)."""
    import socket

    for base in range(20000, 60000 - n, 997):
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind((HOST, base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SystemExit("no run of free ports")


def run_one(pods: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    base = _free_base(pods + 1)
    ready = tmp / f"ready-{pods}"
    server = subprocess.Popen(
        [*bench_module("bench.scrape"), "serve", str(base), str(pods), str(args.busy), str(ready)],
        start_new_session=True,
    )
    gw = None
    try:
        _wait(ready.exists, "the page server")
        doc = yaml.safe_load(Path(args.config).read_text()) or {}
        doc["endpoints"] = [
            {"name": f"pod-{i}", "url": f"http://{HOST}:{base + i}"} for i in range(pods)
        ]
        cfg = tmp / f"gw-{pods}.yaml"
        cfg.write_text(yaml.safe_dump(doc))
        gport = base + pods
        cmd = [
            sys.executable, "-m", "heimdall_proxy", "serve", "--config", str(cfg),
            "--host", HOST, "--port", str(gport), "-v", "0",
            *shlex.split(args.gateway_args),
        ]  # fmt: skip
        gw = subprocess.Popen(
            cmd, cwd=tmp, start_new_session=True, stdout=subprocess.DEVNULL, stderr=tmp.joinpath(
                f"gw-{pods}.log").open("w")
        )  # fmt: skip
        _wait(lambda: _get(f"http://{HOST}:{gport}/ready") is not None, "the gateway")
        time.sleep(args.settle)
        stats_url = f"http://{HOST}:{base}/stats"
        t0 = _get(stats_url)["now"]
        cpu0, wall0 = _cpu_seconds(gw.pid), time.monotonic()
        load0 = os.getloadavg()[0]
        time.sleep(args.window)
        cpu1, wall1 = _cpu_seconds(gw.pid), time.monotonic()
        load1 = os.getloadavg()[0]
        stats = _get(f"{stats_url}?since={t0 - 30}")
    finally:
        for proc in (gw, server):
            if proc is not None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
    gaps_busy: list[float] = []
    gaps_idle: list[float] = []
    count = 0
    for i, ts in stats["scrapes"].items():
        inside = [t for t in ts if t >= t0]
        count += len(inside)
        gaps = [b - a for a, b in itertools.pairwise(ts) if b >= t0]
        (gaps_busy if int(i) < args.busy else gaps_idle).extend(gaps)
    window = wall1 - wall0
    return {
        "pods": pods,
        "busy": min(args.busy, pods),
        "cpu_share": (cpu1 - cpu0) / window,
        "scrapes_per_s": count / window,
        "max_gap_busy_ms": max(gaps_busy) * 1e3 if gaps_busy else None,
        "max_gap_idle_ms": max(gaps_idle) * 1e3 if gaps_idle else None,
        "load_avg": (load0 + load1) / 2,
        "window_s": window,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        base, pods, busy, ready = sys.argv[2:6]
        asyncio.run(_serve(int(base), int(pods), int(busy), ready))
        return
    p = cli.parser(__doc__)
    cli.add_pods(p, "16,64,256", "pod counts, comma-separated (default: %(default)s)")
    p.add_argument("--config", default=str(REPO_ROOT / "config" / "recommended.yaml"))
    cli.add_gateway_args(p)
    p.add_argument("--busy", type=int, default=0, help="pods that report a running request")
    p.add_argument("--settle", type=float, default=5.0, help="seconds before measuring")
    p.add_argument("--window", type=float, default=15.0, help="seconds measured")
    p.add_argument("--label", default="", help="a name for this variant in the output")
    args = p.parse_args()
    import heimdall_proxy

    where = Path(heimdall_proxy.__file__).resolve().parent.parent
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_model('?')}, "
        f"{os.cpu_count()} CPUs, gateway's heimdall_proxy from "
        f"{os.environ.get('PYTHONPATH') or where} (bench commit {git_head()}), "
        f"page {PAGE.stat().st_size} bytes, gateway args {args.gateway_args!r}"
    )
    print("| variant | pods | busy | gateway CPU (share of a core) | scrapes/s | "
          "longest gap busy (ms) | longest gap idle (ms) | load avg |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.pods.split(",")):
            r = run_one(n, args, Path(tmp))

            def ms(v: float | None) -> str:
                return "-" if v is None else f"{v:.0f}"

            print(
                f"| {args.label} | {r['pods']} | {r['busy']} | {r['cpu_share'] * 100:.1f}% | "
                f"{r['scrapes_per_s']:.0f} | {ms(r['max_gap_busy_ms'])} | "
                f"{ms(r['max_gap_idle_ms'])} | {r['load_avg']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
