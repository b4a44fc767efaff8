"""Hot reload under load: requests dropped and the time a reload takes.

Starts N simulated pods (subprocesses) and a gateway process, keeps C client loops sending
streamed completions, and every `--every` seconds rewrites the config (alternating between
the first half of the pods and all of them, and between two plugin sets) and sends SIGHUP.
Reports requests completed and failed (status != 200 or a stream without [DONE]), reloads
applied (from the gateway's log) and the gateway's CPU seconds per reload (its CPU time over
the run, minus a run of the same length without reloads, divided by the reloads).

`--workload prefix` measures what a reload costs routing instead: clients send chat requests
that open with one of `--prompts` long system prompts, the plugins stay prefix-cache-scorer +
queue-scorer, and each reload removes the last pod or brings it back (a scale event). It
reports the pods' own prefix-cache hit rate (their vllm:prefix_cache_hits / _queries) and
the mean latency, without reloads and with them; `--baseline DIR` adds the reloading run
with the gateway code of another tree (`PYTHONPATH=DIR python -P -m heimdall_proxy`).

    python -m bench.reload --pods 4 --clients 16 --duration 20 --every 1
    python -m bench.reload --workload prefix --pods 4 --clients 8 --duration 30 --every 2 \
        --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from bench.harness import cli
from bench.harness.procs import free_port, wait_http

PY = sys.executable
PLUGINS = (
    [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}],
    [{"type": "load-aware-scorer"}, {"type": "prefix-cache-scorer"}],
)
PREFIX_PLUGINS: list[dict[str, object]] = [
    {"type": "prefix-cache-scorer", "weight": 3},
    {"type": "queue-scorer"},
    {"type": "max-score-picker"},
]


def system_prompts(n: int) -> list[str]:
    """`n` system prompts of about 600 words: sharing one is most of a request's prompt."""
    return [
        f"System prompt {i}: " + " ".join(f"rule{i}-{j} applies." for j in range(300))
        for i in range(n)
    ]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write(cfg: Path, ports: list[int], plugins: list[dict[str, object]]) -> None:
    doc = {
        "plugins": plugins,
        "endpoints": [{"name": f"p{p}", "url": f"http://127.0.0.1:{p}"} for p in ports],
    }
    tmp = cfg.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(cfg)


def request(workload: str, rng: random.Random, prompts: list[str]) -> tuple[str, dict[str, object]]:
    if workload == "prefix":
        messages = [
            {"role": "system", "content": rng.choice(prompts)},
            {"role": "user", "content": f"question {rng.randrange(10**9)}"},
        ]
        body = {"model": "sim-model", "messages": messages, "max_tokens": 20, "stream": True}
        return "/v1/chat/completions", body
    body = {"model": "sim-model", "prompt": "hello there", "max_tokens": 20, "stream": True}
    return "/v1/completions", body


async def client(
    base: str, stop: float, counts: dict[str, float], workload: str, seed: int, n_prompts: int
) -> None:
    rng = random.Random(seed)
    prompts = system_prompts(n_prompts)
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < stop:
            path, body = request(workload, rng, prompts)
            t0 = time.monotonic()
            try:
                async with http.post(base + path, json=body) as r:
                    data = await r.read()
                ok = r.status == 200 and b"data: [DONE]" in data
            except aiohttp.ClientError:
                ok = False
            counts["ok" if ok else "failed"] += 1
            counts["latency_s"] += time.monotonic() - t0


async def prefix_counters(ports: list[int]) -> tuple[float, float]:
    """(hits, queries) of vllm:prefix_cache_*, summed over the pods."""
    hits = queries = 0.0
    async with aiohttp.ClientSession() as http:
        for port in ports:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
            for line in text.splitlines():
                if line.startswith("vllm:prefix_cache_hits_total"):
                    hits += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:prefix_cache_queries_total"):
                    queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def run(
    args: argparse.Namespace, reload_every: float, tmp: Path, code: str | None = None
) -> dict[str, float]:
    """One run; `code`: a tree whose gateway code is run instead of this one's."""
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
    prefix = args.workload == "prefix"
    cfg = tmp / "gw.yaml"
    write(cfg, ports, PREFIX_PLUGINS if prefix else PLUGINS[0])
    gw_port = free_port()
    log = tmp / f"gw-{reload_every}-{code is not None}.log"
    env = {**os.environ, "PYTHONPATH": code} if code else None
    python = [PY, "-P"] if code else [PY]
    with log.open("wb") as sink:
        gw = await asyncio.create_subprocess_exec(
            *python, "-m", "heimdall_proxy", "serve", "--config", str(cfg),
            "--host", "127.0.0.1", "--port", str(gw_port), "--log-format", "text",
            stderr=sink, env=env,
        )  # fmt: skip
    base = f"http://127.0.0.1:{gw_port}"
    try:
        for p in ports:
            await wait_http(f"http://127.0.0.1:{p}/health")
        await wait_http(base + "/ready")
        counts = {"ok": 0.0, "failed": 0.0, "latency_s": 0.0}
        cpu0 = cpu_seconds(gw.pid)
        stop = time.monotonic() + args.duration
        clients = [
            asyncio.create_task(client(base, stop, counts, args.workload, i, args.prompts))
            for i in range(args.clients)
        ]
        sent = 0
        while reload_every and time.monotonic() + reload_every < stop:
            await asyncio.sleep(reload_every)
            sent += 1
            if prefix:  # a scale event: the last pod leaves, then comes back
                write(cfg, ports[:-1] if sent % 2 else ports, PREFIX_PLUGINS)
            else:
                half = ports[: max(1, len(ports) // 2)] if sent % 2 else ports
                write(cfg, half, PLUGINS[sent % 2])
            gw.send_signal(signal.SIGHUP)
        await asyncio.gather(*clients)
        cpu = cpu_seconds(gw.pid) - cpu0
        applied = log.read_text().count("config reloaded")
        rejected = log.read_text().count("config reload rejected")
        hits, queries = await prefix_counters(ports)
        mean = counts["latency_s"] / max(counts["ok"] + counts["failed"], 1)
        return {"ok": counts["ok"], "failed": counts["failed"], "sighups": sent,
                "applied": applied, "rejected": rejected, "cpu_s": cpu,
                "hit_rate": hits / queries if queries else 0.0,
                "mean_s": mean}  # fmt: skip
    finally:
        for proc in (gw, *procs):
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()


async def main() -> None:
    p = cli.parser(__doc__)
    cli.add_pods(p)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--every", type=float, default=1.0, help="seconds between reloads")
    p.add_argument("--workload", choices=("hello", "prefix"), default="hello")
    p.add_argument("--prompts", type=int, default=8, help="system prompts (prefix workload)")
    p.add_argument("--baseline", help="also run the reloading run with this tree's gateway code")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        base = await run(args, 0.0, Path(d))
        hot = await run(args, args.every, Path(d))
        old = await run(args, args.every, Path(d), args.baseline) if args.baseline else None
    if args.workload == "prefix":
        print("| run | requests ok | failed | reloads applied | pods' prefix hit rate | mean s |")
        print("|---|---:|---:|---:|---:|---:|")
        runs = [("no reload", base), (f"reload every {args.every:g}s", hot)]
        if old is not None:
            runs.append((f"reload every {args.every:g}s, baseline code", old))
        for name, r in runs:
            print(
                f"| {name} | {r['ok']:.0f} | {r['failed']:.0f} | {r['applied']:.0f} | "
                f"{r['hit_rate']:.1%} | {r['mean_s']:.3f} |"
            )
        print(f"load average: {os.getloadavg()[0]:.2f}")
        return
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
