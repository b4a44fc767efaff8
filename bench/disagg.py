"""Aggregated vs prefill/decode-disaggregated serving on simulated vLLM pods.

Starts N simulated pods and the gateway as separate processes, once with N `both`-role pods
behind the default queue + KV-utilisation profile (aggregated), once with P prefill and N-P
decode pods behind config/pd-disagg.yaml's plugins (the gateway sends each long prompt to a
prefill pod, then to a decode pod with the returned kv_transfer_params). The client sends
the same open-loop Poisson stream of streamed chat completions, each with a long prompt that
shares nothing with the others, and measures TTFT, time per output token and throughput.

    python -m bench.disagg                       # 3 rates x 2 setups, ~1.5 min
    python -m bench.disagg --markdown bench/RESULTS.md
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from bench.harness import cli
from bench.harness.machine import REPO_ROOT
from bench.harness.stats import percentile

MODEL = "sim-model"
ROLE = "mif.moreh.io/role"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Setup:
    name: str
    roles: list[str]
    epp: dict[str, Any]


def aggregated(n: int) -> Setup:
    epp = {
        "plugins": [
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "max-score-picker"},
        ]
    }
    return Setup(f"aggregated {n} x both", ["both"] * n, epp)


def disaggregated(n: int, prefill: int) -> Setup:
    doc = yaml.safe_load((REPO_ROOT / "config" / "pd-disagg.yaml").read_text())
    doc.pop("endpoints")
    roles = ["prefill"] * prefill + ["decode"] * (n - prefill)
    return Setup(f"disaggregated {prefill} prefill + {n - prefill} decode", roles, doc)


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    start: float = 0.0
    end: float = 0.0


def prompt(i: int, words: int) -> str:
    # distinct pieces per request, so no request hits another's prefix cache
    return " ".join(f"r{i}w{j}" for j in range(words))


async def one(
    http: aiohttp.ClientSession, url: str, i: int, words: int, max_tokens: int, res: Result
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt(i, words)}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    t0 = time.perf_counter()
    first: float | None = None
    n = 0
    try:
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                res.errors += 1
                await r.read()
                return
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                doc = orjson.loads(line[6:])
                choices = doc.get("choices") or []
                if choices and choices[0].get("delta", {}).get("content"):
                    n += 1
                    if first is None:
                        first = time.perf_counter()
    except aiohttp.ClientError:
        res.errors += 1
        return
    end = time.perf_counter()
    if first is None:
        res.errors += 1
        return
    res.ttft.append(first - t0)
    res.e2e.append(end - t0)
    if n > 1:
        res.tpot.append((end - first) / (n - 1))
    res.tokens += n
    res.end = max(res.end, end)


async def load(url: str, rate: float, count: int, words: int, max_tokens: int) -> Result:
    res = Result()
    rng = random.Random(7)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        # warm-up: one request so connections and the gateway's pod scrape exist
        await one(http, url, 10**6, 8, 2, Result())
        tasks = []
        res.start = time.perf_counter()
        for i in range(count):
            tasks.append(asyncio.create_task(one(http, url, i, words, max_tokens, res)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return res


def wait_ready(url: str, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready")


@contextlib.contextmanager
def running(setup: Setup, tmp: Path, time_scale: float) -> Iterator[str]:
    procs: list[subprocess.Popen[bytes]] = []
    py = [sys.executable, "-m", "heimdall_proxy"]
    try:
        endpoints = []
        for i, role in enumerate(setup.roles):
            port = free_port()
            name = f"{role}-{i}"
            log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [
                        *py,
                        "sim",
                        "--port",
                        str(port),
                        "--name",
                        name,
                        "--model",
                        MODEL,
                        "--role",
                        role,
                        "--time-scale",
                        str(time_scale),
                        "--side-channel-port",
                        str(5600 + i),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            endpoints.append(
                {"name": name, "url": f"http://127.0.0.1:{port}", "labels": {ROLE: role}}
            )
        for e in endpoints:
            wait_ready(f"{e['url']}/health")
        cfg = tmp / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({**setup.epp, "endpoints": endpoints}))
        gport = free_port()
        glog = open(tmp / "gateway.log", "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [*py, "serve", "--config", str(cfg), "--port", str(gport)],
                stdout=glog,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        url = f"http://127.0.0.1:{gport}"
        wait_ready(f"{url}/ready")
        yield url
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def hops(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=2) as r:
        text = r.read().decode()
    ok = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inference_objective_disagg_hops_total{")
    )
    bad = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inference_objective_disagg_hop_failures_total{")
    )
    return f"{ok:.0f} / {bad:.0f}"


def pct(values: list[float], q: float) -> float:
    """The q-th percentile of `values`, NaN for none (a cell of the table)."""
    p = percentile(values, q)
    return float("nan") if p is None else p


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    cli.add_pods(ap)
    ap.add_argument("--prefill-pods", type=int, default=2)
    ap.add_argument("--rates", default="4,12,20", help="requests/s, comma-separated")
    ap.add_argument("--requests", type=int, default=80, help="per run")
    ap.add_argument("--prompt-words", type=int, default=800, help="~2 tokens per word")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--time-scale", type=float, default=1.0)
    cli.add_output(ap, json=False)  # --markdown PATH appends a section to PATH
    args = ap.parse_args(argv)

    setups = [aggregated(args.pods), disaggregated(args.pods, args.prefill_pods)]
    rows = []
    load0 = os.getloadavg()[0]
    for rate in [float(r) for r in args.rates.split(",")]:
        for setup in setups:
            with (
                tempfile.TemporaryDirectory() as tmp,
                running(setup, Path(tmp), args.time_scale) as url,
            ):
                res = asyncio.run(
                    load(url, rate, args.requests, args.prompt_words, args.max_tokens)
                )
                hop = hops(url)
            span = res.end - res.start
            row = {
                "rate": rate,
                "setup": setup.name,
                "ok": len(res.ttft),
                "errors": res.errors,
                "ttft50": pct(res.ttft, 50) * 1e3,
                "ttft90": pct(res.ttft, 90) * 1e3,
                "tpot50": pct(res.tpot, 50) * 1e3,
                "tpot90": pct(res.tpot, 90) * 1e3,
                "e2e50": pct(res.e2e, 50),
                "tok_s": res.tokens / span if span > 0 else 0.0,
                "req_s": len(res.ttft) / span if span > 0 else 0.0,
                "hops": hop,
            }
            rows.append(row)
            print(
                f"{rate:4.1f} req/s  {setup.name:40s} ok {row['ok']:3d} err {row['errors']}  "
                f"TTFT p50 {row['ttft50']:6.0f} p90 {row['ttft90']:6.0f} ms  "
                f"TPOT p50 {row['tpot50']:5.1f} p90 {row['tpot90']:5.1f} ms  "
                f"{row['tok_s']:6.0f} tok/s  hops ok/failed {hop}",
                flush=True,
            )
    load1 = os.getloadavg()[0]
    if args.markdown:
        cmd = "python -m bench.disagg " + " ".join(argv if argv is not None else sys.argv[1:])
        lines = [
            "",
            "## Disaggregated prefill/decode vs aggregated (simulated pods)",
            "",
            f"Command: `{cmd.strip()}`. Machine: {platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, load average {load0:.1f} -> {load1:.1f}. "
            f"{args.pods} simulated pods (GPU-speed cost model, time scale {args.time_scale}), "
            f"{args.requests} streamed chat completions per run, Poisson arrivals, prompts of "
            f"{args.prompt_words} distinct words (~{2 * args.prompt_words} tokens, no shared "
            f"prefixes), {args.max_tokens} output tokens. Aggregated: every pod `both`, "
            "queue + KV-utilisation scorers. Disaggregated: config/pd-disagg.yaml's plugins "
            f"({args.prefill_pods} prefill pods, the rest decode; every prompt is over "
            "nonCachedTokens, so every request takes the gateway's prefill hop).",
            "",
            "| rate (req/s) | setup | ok / errors | TTFT p50 / p90 (ms) | TPOT p50 / p90 (ms) "
            "| e2e p50 (s) | output tok/s | hops ok / failed |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['rate']:.0f} | {r['setup']} | {r['ok']} / {r['errors']} | "
                f"{r['ttft50']:.0f} / {r['ttft90']:.0f} | {r['tpot50']:.1f} / {r['tpot90']:.1f} | "
                f"{r['e2e50']:.2f} | {r['tok_s']:.0f} | {r['hops']} |"
            )
        cli.write_markdown(args.markdown, "\n".join(lines), append=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
