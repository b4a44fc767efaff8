"""CPU per scheduling decision (parse + candidates + prepare + schedule) against pool size.

For every config and pool size, a Gateway is built in-process on N pods that exist only as
endpoints (nothing is dialled: the decision path contacts no pod), each with a plausible,
fresh metrics snapshot, their labels cycled from the config's own `endpoints:` so role and
context-length configs keep their shape. Requests are chat bodies drawn from 16 system
prompts and varied user turns; after each decision the pre-request hooks run (so prefix
indexes and in-flight counters fill up as in service), and min(64, N) requests are kept in
flight, the oldest completed as a streamed answer with first-token and end times (so the
latency models train and are timed predicting, not falling back). Only `Director.decide` is
timed, in CPU time of the calling thread, with the collector set as the server sets it.

    python -m bench.decisions                       # every config in config/, 8/64/256/1024
    python -m bench.decisions --configs config/recommended.yaml --pods 1024 --profile
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import os
import pstats
import random
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench.harness import cli
from bench.harness.machine import REPO_ROOT, cpu_model, git_head
from heimdall_proxy.config.gateway import parse_config
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.inflight import LoadEstimate
from heimdall_proxy.framework.types import Metrics, RequestContext
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.server.collector import settle
from heimdall_proxy.server.gateway import Gateway

MODEL = "bench-model"
IN_FLIGHT = 64


def _config(path: Path, pods: int) -> Any:
    doc = yaml.safe_load(path.read_text()) or {}
    if "config" in doc and isinstance(doc["config"], dict):
        doc = {**doc, **doc["config"]}
        doc.pop("config")
    old = doc.get("endpoints") or [{}]
    doc["endpoints"] = [
        {
            "name": f"pod-{i}",
            "url": f"http://10.0.{i // 250}.{i % 250 + 1}:8000",
            "labels": dict(old[i % len(old)].get("labels") or {}),
            "models": [MODEL],
        }
        for i in range(pods)
    ]
    for key in ("global", "gateway"):
        doc.pop(key, None)
    return parse_config(doc, str(path))


def _bodies(n: int, rng: random.Random) -> list[bytes]:
    systems = [f"You are assistant {k}. " + "Follow the house rules. " * 40 for k in range(16)]
    out = []
    for i in range(n):
        words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(60))
        doc = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": systems[rng.randrange(16)]},
                {"role": "user", "content": f"question {i}: {words}"},
            ],
            "max_tokens": 64,
        }
        out.append(orjson.dumps(doc))
    return out


async def measure(path: Path, pods: int, requests: int, profile: bool) -> dict[str, Any]:
    rng = random.Random(pods)
    gw = Gateway(_config(path, pods), ServerOptions(), load_builtin_plugins())
    now = time.monotonic()
    for e in gw.pool.endpoints():
        e.metrics = Metrics(
            # Below the saturation detector's limits (queue 5, KV 0.8): flow control admits
            # at once, so what is timed is the decision, not a wait in its queue.
            waiting=rng.randrange(0, 3),
            running=rng.randrange(0, 32),
            kv_cache_usage=rng.random() * 0.6,
            max_lora=4,
            block_size=16,
            num_gpu_blocks=4096,
            updated_at=now,
        )
    for plugin in gw.plugins.lifecycle:
        await plugin.start()
    settle()  # the collector as the server sets it once it is up (server/collector.py)
    bodies = _bodies(requests + 200, rng)
    headers: dict[str, str] = {"content-type": "application/json"}
    flight: collections.deque[RequestContext] = collections.deque()
    samples: list[int] = []
    prof = cProfile.Profile() if profile else None
    refreshed = 0.0
    try:
        for i, body in enumerate(bodies):
            fresh = time.monotonic()
            if fresh - refreshed > 0.05:  # fresh snapshots, as a scraper keeps them (< 200 ms)
                refreshed = fresh
                for e in gw.pool.endpoints():
                    e.metrics = Metrics(
                        waiting=e.metrics.waiting,
                        running=e.metrics.running,
                        kv_cache_usage=e.metrics.kv_cache_usage,
                        max_lora=4,
                        block_size=16,
                        num_gpu_blocks=4096,
                        updated_at=fresh,
                    )
            if prof is not None and i >= 200:
                prof.enable()
            t0 = time.thread_time_ns()
            async with asyncio.timeout(5):  # a queued request is a harness error, not a figure
                decision = await gw.director.decide("/v1/chat/completions", body, headers)
            t1 = time.thread_time_ns()
            if prof is not None:
                prof.disable()
            if i >= 200:  # the first ones warm caches and indexes
                samples.append(t1 - t0)
            ctx = RequestContext(
                decision.request,
                decision.state,
                decision.result,
                decision.result.primary.targets[0],
            )
            # as the relay does: the ledger counts the attempt, then the hooks run
            gw.load.acquire(ctx.key, ctx.target.name, *LoadEstimate()(ctx))
            if gw.hooks.pre_request:
                await gw.hooks.pre_request.run(ctx)
            flight.append(ctx)
            if decision.admission is not None:
                decision.admission.finish()
            if len(flight) > min(IN_FLIGHT, pods):
                old = flight.popleft()
                gw.load.release(old.key)
                # a streamed answer, timed as the relay times one: the first token after a
                # delay growing with the pod's queue, then 64 tokens (so the latency
                # producers train and their predictions, not their fallbacks, are timed)
                m = old.target.metrics
                old.status = 200
                old.started_at = old.started_at or time.monotonic()
                old.first_chunk_at = old.started_at + 0.02 + 0.01 * (m.waiting + m.running / 8)
                old.last_chunk_at = old.first_chunk_at + 0.63
                old.events_seen = old.output_tokens = 64
                if gw.hooks.response_complete:
                    await gw.hooks.response_complete.run(old)
    finally:
        for plugin in reversed(gw.plugins.lifecycle):
            await plugin.stop()
        await gw.flow.stop()
    samples.sort()
    if prof is not None:
        stats = pstats.Stats(prof)
        stats.sort_stats("cumulative").print_stats(25)
    q = lambda f: samples[min(len(samples) - 1, int(f * len(samples)))] / 1e6  # noqa: E731
    return {"p50": q(0.5), "p99": q(0.99), "mean": sum(samples) / len(samples) / 1e6}


def main() -> None:
    p = cli.parser(__doc__)
    p.add_argument("--configs", nargs="*", default=None)
    cli.add_pods(p, "8,64,256,1024", "pod counts, comma-separated (default: %(default)s)")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--profile", action="store_true", help="cProfile the timed calls")
    args = p.parse_args()
    configs = [Path(c) for c in args.configs] if args.configs else sorted(
        (REPO_ROOT / "config").glob("*.yaml")
    )  # fmt: skip
    pods = [int(x) for x in args.pods.split(",")]
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_model('?')}, "
        f"{os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f}, commit {git_head()}, "
        f"{args.requests} requests per cell; CPU ms per decision, p50 / p99"
    )
    print("| config | " + " | ".join(f"{n} pods" for n in pods) + " |")
    print("|---|" + "---:|" * len(pods))
    for path in configs:
        cells = []
        for n in pods:
            try:
                r = asyncio.run(measure(path, n, args.requests, args.profile))
                cells.append(f"{r['p50']:.3f} / {r['p99']:.3f}")
            except Exception as exc:  # a config this harness cannot build: say why
                cells.append(f"n/a ({type(exc).__name__}: {str(exc)[:60]})")
        print(f"| {path.name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
