"""Latency-predicted scheduling (issue #13) on simulated pods, in three parts.

* ``unequal``: half the pods 4x slower per token (every cost of the simulator's model x4),
  moderate streamed load. Per target: share of requests on the fast pods, e2e and TTFT p95,
  and (gateway targets with the producer) the predictor's MAPE read from the gateway's
  /metrics (heimdall_latency_*_prediction_error_ratio).
* ``overload``: equal pods, more load than they can serve, half the requests sheddable
  (objective ``batch``, priority -1) and half not (``interactive``), all with
  x-slo-ttft-ms / x-slo-tpot-ms. Per target and class: how many were shed (429) and how many
  of the served ones met both SLOs, as the client measured them.
* ``cost``: the producer's prediction step in-process for 64 candidate pods (features,
  numpy product, CycleState), p50/p99 per request, and the training cost per observation.
* ``remote``: the producer's step with and without a prediction server speaking GIE's
  sidecar API (a stand-in with constant answers, in a subprocess on localhost).

    python -m bench.latency unequal --targets round_robin config/recommended.yaml \\
        config/predicted-latency.yaml
    python -m bench.latency overload --targets config/recommended.yaml \\
        config/predicted-latency.yaml
    python -m bench.latency cost --pods 64
    python -m bench.latency remote --pods 64 --iterations 2000

Prints a markdown table per part (results JSON under bench/out/latency-*)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.harness import cli, runner, stats
from bench.harness.gateway import gateway_config
from bench.harness.pods import FleetSpec, fleet, sim_flags
from bench.harness.procs import HOST, Proc, free_port, http_get, wait_until
from bench.harness.targets import Target, parse_target, router_command, router_ready
from bench.harness.workloads import COMPLETIONS, TimedRequest, Workload, _sampling, words_text

#: Every cost of the simulator's model four times its default: 4x slower per token.
SLOW4 = ("--step-base", "0.032", "--prefill-cost-per-token", "0.00024",
         "--decode-cost-per-seq", "0.0006", "--kv-read-cost-per-token", "2.4e-7")  # fmt: skip
OBJECTIVES = {"interactive": 10, "batch": -1}


def poisson_workload(
    name: str, rate: float, requests: int, seed: int, headers_for: Any = None
) -> Workload:
    """Streamed completions arriving as a Poisson process: prompts of 100-800 words (about as
    many tokens), 16-48 output tokens. `headers_for(rng)` gives (tag, headers) per request."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(requests):
        t += rng.expovariate(rate)
        tag, headers = headers_for(rng) if headers_for else ("all", {})
        body = {"model": "sim-model", "prompt": words_text(rng, rng.randint(100, 800)),
                **_sampling(rng.randint(16, 48), True)}  # fmt: skip
        out.append(TimedRequest(f"l{i:04d}", round(t, 4), COMPLETIONS, body, tag, headers))
    return Workload(name, {"rate": rate, "requests": requests, "seed": seed}, out)


def error_ratios(metrics_text: str) -> dict[str, float | None]:
    m = runner.parse_metrics(metrics_text)
    out: dict[str, float | None] = {}
    for kind in ("ttft", "tpot"):
        count = m.get(f"heimdall_latency_{kind}_prediction_error_ratio_count")
        total = m.get(f"heimdall_latency_{kind}_prediction_error_ratio_sum")
        out[kind] = total / count if count and total is not None else None
    return out


def run_target(
    target: Target, workload: Workload, spec: FleetSpec, out_dir: Path
) -> tuple[runner.RunResult, dict[str, float | None], list[str]]:
    """bench.harness.targets.run_target, plus the gateway's /metrics read before it stops."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with fleet(spec, logs, target.slug, False) as pods:
        config_path = None
        if target.kind == "gateway":
            doc = yaml.safe_load(Path(target.arg).read_text()) or {}
            doc = gateway_config(doc, pods)
            doc.setdefault(
                "objectives", [{"name": k, "priority": v} for k, v in OBJECTIVES.items()]
            )
            config_path = out_dir / f"{target.slug}.config.yaml"
            config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        port = free_port()
        argv = router_command(target, pods, port, config_path, [])
        proc = Proc(target.slug, argv, logs / f"{target.slug}-router.log").start()
        errors: dict[str, float | None] = {}
        try:
            url = f"http://{HOST}:{port}"
            wait_until(proc, lambda: router_ready(target, url, len(pods), spec.model), "router")
            result = asyncio.run(
                runner.run_workload(
                    workload, url, {p.name: p.url for p in pods}, progress=False,
                    label=target.label,
                )
            )  # fmt: skip
            if target.kind == "gateway":
                errors = error_ratios(http_get(url + "/metrics")[1])
        finally:
            proc.stop()
    result.save(out_dir / f"{target.slug}.json")
    return result, errors, argv


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def unequal(args: argparse.Namespace) -> list[str]:
    workload = poisson_workload("latency-unequal", args.rate, args.requests, args.seed)
    per_pod = [[], [], list(SLOW4), list(SLOW4)]
    spec = FleetSpec(
        args.pods, "sim-model", ["--max-num-seqs", str(args.slots)], args.time_scale,
        args.seed, "off", sim_flags(), per_pod_args=per_pod,
    )  # fmt: skip
    fast = {f"pod-{i}" for i in range(args.pods) if not per_pod[i % len(per_pod)]}
    lines = [
        "| target | requests on fast pods | e2e p50 (ms) | e2e p95 (ms) | TTFT p95 (ms) "
        "| errors | TTFT MAPE | TPOT MAPE |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for spec_str in args.targets:
        target = parse_target(spec_str)
        result, errors, _ = run_target(target, workload, spec, args.out_dir / "unequal")
        s = result.summary
        per = s["requests_per_pod"]
        share = sum(n for p, n in per.items() if p in fast) / max(1, sum(per.values()))
        lines.append(
            f"| {target.label} | {share * 100:.0f}% | {_ms(s['e2e']['p50'])} "
            f"| {_ms(s['e2e']['p95'])} | {_ms(s['ttft']['p95'])} | {s['errors']} "
            f"| {_pct(errors.get('ttft'))} | {_pct(errors.get('tpot'))} |"
        )
        print(lines[-1], file=sys.stderr)
    return lines


def overload(args: argparse.Namespace) -> list[str]:
    slo = {"x-slo-ttft-ms": str(args.slo_ttft_ms), "x-slo-tpot-ms": str(args.slo_tpot_ms)}

    def classes(rng: random.Random) -> tuple[str, dict[str, str]]:
        name = "batch" if rng.random() < args.sheddable_share else "interactive"
        return name, {**slo, "x-gateway-inference-objective": name}

    workload = poisson_workload(
        "latency-overload", args.rate, args.requests, args.seed, headers_for=classes
    )
    spec = FleetSpec(
        args.pods, "sim-model", ["--max-num-seqs", str(args.slots)], args.time_scale,
        args.seed, "off", sim_flags(),
    )  # fmt: skip
    lines = [
        "| target | class | sent | shed (429) | other errors | served within both SLOs "
        "| TTFT p95 (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec_str in args.targets:
        target = parse_target(spec_str)
        result, _, _ = run_target(target, workload, spec, args.out_dir / "overload")
        for cls in ("interactive", "batch"):
            rs = [r for r in result.requests if r.tag == cls]
            shed = sum(1 for r in rs if r.status == 429)
            ok = [r for r in rs if r.ok]
            met = 0
            for r in ok:
                tpot = None
                if r.ttft is not None and r.e2e is not None and (r.completion_tokens or 0) > 1:
                    tpot = (r.e2e - r.ttft) / (r.completion_tokens - 1)  # type: ignore[operator]
                if (
                    r.ttft is not None
                    and r.ttft * 1000 <= args.slo_ttft_ms
                    and (tpot is None or tpot * 1000 <= args.slo_tpot_ms)
                ):
                    met += 1
            ttfts = [r.ttft for r in ok if r.ttft is not None]
            p95 = stats.percentile(ttfts, 95)
            lines.append(
                f"| {target.label} | {cls} | {len(rs)} | {shed} "
                f"| {len(rs) - len(ok) - shed} | {met}/{len(ok)} "
                f"({(met / len(ok) * 100) if ok else 0:.0f}%) | {_ms(p95)} |"
            )
            print(lines[-1], file=sys.stderr)
    return lines


def cost(args: argparse.Namespace) -> list[str]:
    """The producer's predict() for `pods` candidates, on a model trained on synthetic
    observations (the cost does not depend on what was learned)."""
    from heimdall_proxy.framework.handle import PluginHandle
    from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, Metrics
    from heimdall_proxy.plugins.predicted_latency.producer import (
        PredictedLatencyProducer,
        PredictedLatencyProducerParams,
    )

    rng = random.Random(args.seed)
    pods = [
        Endpoint(f"pod-{i}", f"http://h{i}:80", f"h{i}", 80,
                 metrics=Metrics(waiting=rng.randint(0, 8), running=rng.randint(0, 32),
                                 kv_cache_usage=rng.random(), updated_at=1.0))
        for i in range(args.pods)
    ]  # fmt: skip
    producer = PredictedLatencyProducer(
        "p",
        PredictedLatencyProducerParams(streamingMode=True),
        PluginHandle(pool=None),  # type: ignore[arg-type]
    )
    t0 = time.perf_counter()
    n_train = 4000
    for _ in range(n_train):
        row = [rng.random() for _ in range(8)]
        pod = rng.choice(pods).name
        producer.predictor.ttft.observe(pod, row, 0.05 + sum(row) * 0.1)
        producer.predictor.tpot.observe(pod, row, 0.01 + sum(row) * 0.002)
    train = (time.perf_counter() - t0) / (2 * n_train)
    body = {"model": "m", "prompt": "word " * 500, "max_tokens": 64}
    headers = {"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "50"}
    times, walls = [], []
    for i in range(args.iterations):
        req = InferenceRequest("completions", "/v1/completions", "m", b"{}", body, headers)
        state = CycleState()
        # CPU time of this thread: on a shared machine the wall clock also counts the time
        # other processes held the core
        c, w = time.thread_time(), time.perf_counter()
        producer.predict(state, req, pods)
        times.append(time.thread_time() - c)
        walls.append(time.perf_counter() - w)
        if i % 100 == 0:  # some requests in flight, as in a live gateway
            producer.load.acquire(f"{i}:0", rng.choice(pods).name, 500, 0, 500)
    p50, p99 = stats.percentile(times, 50) or 0.0, stats.percentile(times, 99) or 0.0
    wall99 = stats.percentile(walls, 99) or 0.0
    return [
        "| candidates | CPU per request (TTFT+TPOT for all) p50 | p99 | wall p99 "
        "| training per observation |",
        "|---|---|---|---|---|",
        f"| {args.pods} | {p50 * 1e3:.3f} ms | {p99 * 1e3:.3f} ms | {wall99 * 1e3:.3f} ms "
        f"| {train * 1e3:.3f} ms |",
    ]


def remote(args: argparse.Namespace) -> list[str]:
    """produce() for `pods` candidates with and without a remote prediction server: a
    stand-in speaking GIE's sidecar API (`POST /predict/bulk/strict`, constant answers) in a
    subprocess on localhost, so the figure is our client's cost plus the HTTP round trip,
    not a real model's inference time."""
    import subprocess

    from heimdall_proxy.framework.handle import PluginHandle
    from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, Metrics
    from heimdall_proxy.plugins.predicted_latency.producer import (
        PredictedLatencyProducer,
        PredictedLatencyProducerParams,
    )

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", _STAND_IN, str(port)], stdout=subprocess.DEVNULL
    )
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 30.0
    while http_get(url + "/readyz")[0] != 200:
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise RuntimeError("the prediction-server stand-in did not start")
        time.sleep(0.1)
    rng = random.Random(args.seed)
    pods = [
        Endpoint(f"pod-{i}", f"http://h{i}:80", f"h{i}", 80,
                 metrics=Metrics(waiting=rng.randint(0, 8), running=rng.randint(0, 32),
                                 kv_cache_usage=rng.random(), updated_at=1.0))
        for i in range(args.pods)
    ]  # fmt: skip
    body = {"model": "m", "prompt": "word " * 500, "max_tokens": 64}

    async def run(params: dict[str, Any]) -> tuple[list[float], list[float]]:
        producer = PredictedLatencyProducer(
            "p",
            PredictedLatencyProducerParams(streamingMode=True, **params),
            PluginHandle(pool=None),  # type: ignore[arg-type]
        )
        for _ in range(64):
            row = [rng.random() for _ in range(8)]
            producer.predictor.ttft.observe("pod-0", row, 0.1)
            producer.predictor.tpot.observe("pod-0", row, 0.01)
        await producer.start()
        cpu, wall = [], []
        try:
            for _ in range(args.iterations):
                req = InferenceRequest("completions", "/v1/completions", "m", b"{}", body, {})
                c, w = time.thread_time(), time.perf_counter()
                await producer.produce(CycleState(), req, pods)
                cpu.append(time.thread_time() - c)
                wall.append(time.perf_counter() - w)
            if producer.remote is not None:
                assert producer.remote.available, "the stand-in stopped answering"
        finally:
            await producer.stop()
        return sorted(cpu), sorted(wall)

    lines = [
        "| predictor | CPU p50 | CPU p99 | wall p50 | wall p99 |",
        "|---|---|---|---|---|",
    ]
    try:
        for label, params in (
            ("in-process", {}),
            ("remote (stand-in on localhost)", {"predictionServerURL": url,
                                                "predictorTimeout": "1s"}),
        ):  # fmt: skip
            cpu, wall = asyncio.run(run(params))
            c, w = stats.distribution(cpu, scale=1e3), stats.distribution(wall, scale=1e3)
            lines.append(
                f"| {label} | {c['p50']:.3f} ms | {c['p99']:.3f} ms "
                f"| {w['p50']:.3f} ms | {w['p99']:.3f} ms |"
            )
    finally:
        server.terminate()
        server.wait(5)
    return lines


#: GIE's prediction-server API with constant answers, run by `remote` in a subprocess.
_STAND_IN = """
import sys
from aiohttp import web
async def predict(request):
    reqs = (await request.json())["requests"]
    preds = [{"ttft_ms": 200.0, "tpot_ms": 20.0} for _ in reqs]
    return web.json_response({"predictions": preds, "total_requests": len(reqs),
                              "successful_predictions": len(reqs), "failed_predictions": 0,
                              "processing_time_ms": 0.0})
async def ready(request):
    return web.json_response({"ready": True})
app = web.Application()
app.router.add_post("/predict/bulk/strict", predict)
app.router.add_get("/readyz", ready)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("part", choices=("unequal", "overload", "cost", "remote"))
    parser.add_argument("--targets", nargs="+", default=["config/predicted-latency.yaml"])
    cli.add_pods(parser, None, "pods (default: the part's)")
    parser.add_argument("--rate", type=float, default=None, help="requests per second")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--slots", type=int, default=8, help="--max-num-seqs of each pod")
    parser.add_argument("--time-scale", type=float, default=5.0)
    cli.add_seed(parser)
    parser.add_argument("--slo-ttft-ms", type=float, default=1500.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=150.0)
    parser.add_argument("--sheddable-share", type=float, default=0.5)
    parser.add_argument("--iterations", type=int, default=5000)
    cli.add_output(parser, out_dir="latency", json=False, markdown=False)
    args = parser.parse_args(argv)
    defaults = {
        "unequal": (4, 5.0, 300),
        "overload": (2, 14.0, 420),
        "cost": (64, 0.0, 0),
        "remote": (64, 0.0, 0),
    }
    pods, rate, requests = defaults[args.part]
    args.pods = args.pods or pods
    args.rate = args.rate or rate
    args.requests = args.requests or requests
    with contextlib.suppress(AttributeError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    parts = {"unequal": unequal, "overload": overload, "cost": cost, "remote": remote}
    lines = parts[args.part](args)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
