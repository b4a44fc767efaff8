"""A long Responses conversation through the responses-store: memory and per-turn latency.

Starts one simulated pod and a gateway with `responses-store` (in-memory, its defaults),
then drives `--turns` short turns, each continuing the previous one by
`previous_response_id` (one client, one turn at a time: non-streamed, `max_output_tokens`
4). Reports the gateway's resident memory (VmRSS) after the first turn and at the end, and
the per-turn latency (median and p95) of the first and the last `--window` turns. The
pod's own share grows with the conversation too (it reads the whole history every turn), so
for the turns of both windows the same self-contained request (the history the client kept,
`store: false`) is also sent to the pod directly: "gateway adds" is the difference.
`--baseline DIR` runs the same chain against the gateway code of another tree
(`PYTHONPATH=DIR python -P -m heimdall_proxy`), e.g. `git archive main heimdall_proxy | tar
-x -C /tmp/before`; the pod is this tree's either way.

    python -m bench.store_chain --turns 3000
    python -m bench.store_chain --turns 3000 --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import yaml

from bench.harness import cli
from bench.harness.procs import free_port, wait_http
from bench.harness.stats import percentile

PY = sys.executable
MODEL = "sim-model"
JSON = {"Content-Type": "application/json"}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def run(args: argparse.Namespace, tmp: Path, code: str | None) -> dict[str, float]:
    pod_port, gw_port = free_port(), free_port()
    pod = await asyncio.create_subprocess_exec(
        PY, "-m", "heimdall_proxy", "sim", "--host", "127.0.0.1", "--port", str(pod_port),
        "--name", "pod", "--model", MODEL, "--max-model-len", "100000000",
        "--num-gpu-blocks", "10000000", "--time-scale", "0",
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    cfg = tmp / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "featureGates": ["prepareDataPlugins"],
                "plugins": [{"type": "responses-store"}],
                "endpoints": [{"name": "pod", "url": f"http://127.0.0.1:{pod_port}"}],
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": code} if code else None
    python = [PY, "-P"] if code else [PY]
    log = tmp / f"gw-{code is not None}.log"
    with log.open("wb") as sink:
        gw = await asyncio.create_subprocess_exec(
            *python, "-m", "heimdall_proxy", "serve", "--config", str(cfg),
            "--host", "127.0.0.1", "--port", str(gw_port), "--log-format", "text",
            stderr=sink, env=env,
        )  # fmt: skip
    base = f"http://127.0.0.1:{gw_port}"
    pod_url = f"http://127.0.0.1:{pod_port}"
    try:
        await wait_http(f"http://127.0.0.1:{pod_port}/health")
        await wait_http(base + "/ready")
        latencies: list[float] = []
        direct: dict[int, float] = {}
        history: list[object] = []
        previous: str | None = None
        rss_first = 0.0
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for turn in range(args.turns):
                body: dict[str, object] = {
                    "model": MODEL,
                    "input": f"Turn {turn}: one more short question?",
                    "max_output_tokens": 4,
                }
                if previous is not None:
                    body["previous_response_id"] = previous
                user = {"type": "message", "role": "user", "content": body["input"]}
                if turn <= args.window or turn >= args.turns - args.window:
                    alone = {**body, "input": [*history, user], "store": False}
                    alone.pop("previous_response_id", None)
                    raw = orjson.dumps(alone)  # serialised before the clock starts
                    t0 = time.perf_counter()
                    async with http.post(pod_url + "/v1/responses", data=raw, headers=JSON) as r:
                        await r.read()
                    direct[turn] = time.perf_counter() - t0
                t0 = time.perf_counter()
                async with http.post(base + "/v1/responses", json=body) as r:
                    doc = await r.json()
                    if r.status != 200:
                        raise RuntimeError(f"turn {turn}: {r.status} {doc}")
                latencies.append(time.perf_counter() - t0)
                previous = doc["id"]
                history += [user, *doc["output"]]
                if turn == 0:
                    rss_first = rss_mb(gw.pid)
                if args.progress and turn % 500 == 0:
                    print(f"  turn {turn}: {latencies[-1] * 1000:.1f} ms", file=sys.stderr)
        w = args.window
        head, tail = latencies[1 : w + 1], latencies[-w:]
        n = len(latencies)
        added_head = [latencies[t] - direct[t] for t in range(1, w + 1)]
        added_tail = [latencies[t] - direct[t] for t in range(n - w, n)]
        return {
            "added_head": statistics.median(added_head) * 1000,
            "added_tail": statistics.median(added_tail) * 1000,
            "rss_first": rss_first,
            "rss_end": rss_mb(gw.pid),
            "head_p50": statistics.median(head) * 1000,
            "head_p95": (percentile(head, 95) or 0.0) * 1000,
            "tail_p50": statistics.median(tail) * 1000,
            "tail_p95": (percentile(tail, 95) or 0.0) * 1000,
            "total_s": sum(latencies),
        }
    finally:
        for proc in (gw, pod):
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()


async def main() -> None:
    p = cli.parser(__doc__)
    p.add_argument("--turns", type=int, default=3000)
    p.add_argument("--window", type=int, default=100, help="turns per latency window")
    p.add_argument("--baseline", help="also run the chain with this tree's gateway code")
    p.add_argument("--progress", action="store_true")
    args = p.parse_args()
    if args.turns <= args.window:
        p.error(f"--turns ({args.turns}) must be more than --window ({args.window})")
    runs: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as d:
        if args.baseline:
            runs.append(("baseline", await run(args, Path(d), args.baseline)))
        runs.append(("this tree", await run(args, Path(d), None)))
    w = args.window
    print(
        f"| code | gateway RSS after turn 1 (MB) | after turn {args.turns} (MB) | growth (MB) "
        f"| turns 2-{w + 1} p50 / p95 (ms) | last {w} turns p50 / p95 (ms) "
        "| gateway adds, first / last (p50 ms) | whole chain (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in runs:
        print(
            f"| {name} | {r['rss_first']:.0f} | {r['rss_end']:.0f} | "
            f"{r['rss_end'] - r['rss_first']:.0f} | {r['head_p50']:.1f} / {r['head_p95']:.1f} | "
            f"{r['tail_p50']:.1f} / {r['tail_p95']:.1f} | "
            f"{r['added_head']:.1f} / {r['added_tail']:.1f} | {r['total_s']:.0f} |"
        )
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
