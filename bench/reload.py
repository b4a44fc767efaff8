"""Hot reload under load: requests dropped and the time a reload takes.

Starts N simulated pods (subprocesses) and a gateway process, keeps C client loops sending
streamed completions, and every `--every` seconds rewrites the config (alternating between
the first half of the pods and all of them, and between two plugin sets) and sends SIGHUP.
Reports requests completed and failed (status != 200 or a stream without [DONE]), reloads
applied (from the gateway's log) and the gateway's CPU seconds per reload (its CPU time over
the run, minus a run of the same length without reloads, divided by the reloads).

    python bench/reload.py --pods 4 --clients 16 --duration 20 --every 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

PY = sys.executable
PLUGINS = (
    [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}],
    [{"type": "load-aware-scorer"}, {"type": "prefix-cache-scorer"}],
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_http(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never answered")


def write(cfg: Path, ports: list[int], plugins: list[dict[str, object]]) -> None:
    doc = {
        "plugins": plugins,
        "endpoints": [{"name": f"p{p}", "url": f"http://127.0.0.1:{p}"} for p in ports],
    }
    tmp = cfg.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(cfg)


async def client(base: str, stop: float, counts: dict[str, int]) -> None:
    body = {"model": "sim-model", "prompt": "hello there", "max_tokens": 20, "stream": True}
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < stop:
            try:
                async with http.post(base + "/v1/completions", json=body) as r:
                    data = await r.read()
                ok = r.status == 200 and b"data: [DONE]" in data
            except aiohttp.ClientError:
                ok = False
            counts["ok" if ok else "failed"] += 1


async def run(args: argparse.Namespace, reload_every: float, tmp: Path) -> dict[str, float]:
    ports = [free_port() for _ in range(args.pods)]
    procs = [
        await asyncio.create_subprocess_exec(
            PY,
            "-m",
            "heimdall_proxy",
            "sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(p),
            "--name",
            f"p{p}",
            stderr=asyncio.subprocess.DEVNULL,
        )
        for p in ports
    ]
    cfg = tmp / "gw.yaml"
    write(cfg, ports, PLUGINS[0])
    gw_port = free_port()
    log = tmp / f"gw-{reload_every}.log"
    with log.open("wb") as sink:
        gw = await asyncio.create_subprocess_exec(
            PY, "-m", "heimdall_proxy", "serve", "--config", str(cfg), "--host", "127.0.0.1",
            "--port", str(gw_port), "--log-format", "text", stderr=sink,
        )  # fmt: skip
    base = f"http://127.0.0.1:{gw_port}"
    try:
        for p in ports:
            await wait_http(f"http://127.0.0.1:{p}/health")
        await wait_http(base + "/ready")
        counts = {"ok": 0, "failed": 0}
        cpu0 = cpu_seconds(gw.pid)
        stop = time.monotonic() + args.duration
        clients = [asyncio.create_task(client(base, stop, counts)) for _ in range(args.clients)]
        sent = 0
        while reload_every and time.monotonic() + reload_every < stop:
            await asyncio.sleep(reload_every)
            sent += 1
            half = ports[: max(1, len(ports) // 2)] if sent % 2 else ports
            write(cfg, half, PLUGINS[sent % 2])
            gw.send_signal(signal.SIGHUP)
        await asyncio.gather(*clients)
        cpu = cpu_seconds(gw.pid) - cpu0
        applied = log.read_text().count("config reloaded")
        rejected = log.read_text().count("config reload rejected")
        return {"ok": counts["ok"], "failed": counts["failed"], "sighups": sent,
                "applied": applied, "rejected": rejected, "cpu_s": cpu}  # fmt: skip
    finally:
        for proc in (gw, *procs):
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=4)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--every", type=float, default=1.0, help="seconds between reloads")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        base = await run(args, 0.0, Path(d))
        hot = await run(args, args.every, Path(d))
    print("| run | requests ok | failed | SIGHUPs | reloads applied | gateway CPU s | ok/CPU s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in (("no reload", base), (f"reload every {args.every:g}s", hot)):
        print(
            f"| {name} | {r['ok']:.0f} | {r['failed']:.0f} | {r['sighups']:.0f} | "
            f"{r['applied']:.0f} | {r['cpu_s']:.2f} | {r['ok'] / max(r['cpu_s'], 1e-9):.0f} |"
        )
    # the reloading run's CPU minus what its requests cost at the baseline's CPU per request
    extra = hot["cpu_s"] - base["cpu_s"] / max(base["ok"], 1) * hot["ok"]
    if hot["applied"]:
        per = extra / hot["applied"] * 1000
        print(f"\nextra gateway CPU per reload (at the same request count): {per:.1f} ms")
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
