"""Active-active replicas: two gateway processes sharing routing state through Redis, against
one gateway, on the matrix's chat shapes (issue 17 item 3).

Per shape, each variant on a fresh simulated fleet with the same request schedule:

- `1 replica`: the config as is (state in memory);
- `1 replica + redis`: the same config with `redisConfig` on every scorer that can share its
  state: what sharing costs one process (CPU per request, latency), with no one to share with;
- `2 replicas + redis`: two gateway processes sharing the state, requests dealt to them in
  turn (a balancer with no affinity: every other turn of a conversation arrives at the
  other replica, the hardest split for the prefix index);
- `2 replicas + redis, all sent to one`: the same pair, every request to the first one: the
  second process's background cost (metrics scraping, sync) without any split, to tell the
  cost of a second process on these 2 cores from the effect of splitting the traffic;
- `2 replicas, not shared`: the split with state in memory, what sharing fixes;
- vllm-router round_robin, for scale.

Acceptance: the shared pair's prefix hit rate and E2E p95 within 5% of one replica's. One
run's p95 moves by up to 10% against itself, so over several `--seeds` it is judged on the
figures pooled over the seeds, with their interval (bench/harness/stats.py).
Gateway CPU is the sum over the replica processes (Redis's own CPU is not included: other
jobs on this machine use the same server).

    python -m bench.replicas --quick --markdown bench/out/replicas.md
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
import yaml

from bench import matrix
from bench.harness import cli, machine, runner, stats, workloads
from bench.harness.gateway import gateway_config
from bench.harness.pods import FleetSpec, fleet, sim_flags
from bench.harness.procs import HOST, Proc, free_port, wait_until
from bench.harness.targets import Target, router_command, router_ready, run_target

#: The scorers that take redisConfig to share their state.
SHAREABLE = frozenset(
    {
        "prefix-cache-scorer",
        "no-hit-lru-scorer",
        "active-request-scorer",
        "outstanding-work-scorer",
        "prefix-cache-affinity-filter",
    }
)
SHAPES = ("hot-prefix", "multi-turn")


def shared_config(
    doc: Mapping[str, Any], address: str, key_prefix: str, sync_interval: str | None = None
) -> dict[str, Any]:
    """A copy of `doc` with `redisConfig` (and `syncInterval`, when given) set on every
    shareable plugin."""
    out = copy.deepcopy(dict(doc))
    epp = out.get("config", out)
    for plugin in epp.get("plugins", []):
        if plugin.get("type") in SHAREABLE:
            params = plugin.setdefault("parameters", {}) or {}
            params["redisConfig"] = {"address": address, "keyPrefix": key_prefix}
            if sync_interval:
                params["syncInterval"] = sync_interval
            plugin["parameters"] = params
    return out


def drop_keys(address: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(address)
    try:
        keys = list(client.scan_iter(match=key_prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def run_gateways(
    label: str,
    doc: Mapping[str, Any],
    replicas: int,
    workload: Any,
    spec: FleetSpec,
    out: Path,
    senders: int | None = None,
    trace: bool = False,
) -> dict[str, Any]:
    """Run `workload` through `replicas` gateway processes with config `doc` on a fresh fleet,
    requests dealt to the first `senders` of them (all by default)."""
    slug = label.replace(" ", "-").replace(",", "").replace("+", "")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    target = Target("gateway", "replicas")
    with fleet(spec, logs, slug, False) as pods:
        path = out / f"{slug}.config.yaml"
        path.write_text(yaml.safe_dump(gateway_config(doc, pods), sort_keys=False))
        procs: list[Proc] = []
        urls: list[str] = []
        try:
            for r in range(replicas):
                port = free_port()
                extra = ["-v", "3"] if trace else []  # the affinity filter's trace lines
                argv = router_command(target, pods, port, path, extra)
                procs.append(Proc(f"{slug}-{r}", argv, logs / f"{slug}-r{r}.log").start())
                urls.append(f"http://{HOST}:{port}")
            for proc, url in zip(procs, urls, strict=True):
                wait_until(
                    proc,
                    lambda u=url: router_ready(target, u, len(pods), spec.model),
                    "the gateway to see every pod",
                )
            cpu0 = [p.cpu_seconds() or 0.0 for p in procs]
            result = asyncio.run(
                runner.run_workload(
                    workload,
                    urls[: senders or replicas],
                    {p.name: p.url for p in pods},
                    progress=False,
                    label=label,
                )
            )
            cpu1 = [p.cpu_seconds() or 0.0 for p in procs]
            for proc in procs:
                if not proc.alive():
                    raise RuntimeError(f"{label}: a replica died:\n{proc.tail()}")
        finally:
            for proc in procs:
                proc.stop()
    cpu = sum(b - a for a, b in zip(cpu0, cpu1, strict=True))
    row = summarize(label, replicas, result.summary, cpu, len(workload.requests))
    row.update(samples(result))
    row["logs"] = [str(logs / f"{slug}-r{r}.log") for r in range(replicas)]
    return row


def summarize(
    label: str, replicas: int, s: Mapping[str, Any], cpu: float | None, n: int
) -> dict[str, Any]:
    return {
        "label": label,
        "replicas": replicas,
        "total": s["wall_clock"],
        "ttft": s["ttft"],
        "e2e": s["e2e"],
        "prefix_hit_rate": s.get("prefix_hit_rate"),
        "errors": s["errors"],
        "gateway_cpu_s": cpu,
        "cpu_ms_per_request": cpu / n * 1000 if cpu is not None else None,
    }


def samples(result: runner.RunResult) -> dict[str, Any]:
    """What pooling over seeds needs (bench/harness/stats.py): every successful request's E2E
    latency and the fleet's prefix hits and queries (the hit rate's numerator and
    denominator, so that seeds pool by their token counts, not as a mean of rates); and
    which pod served each request."""
    hits = queries = 0.0
    for pod in result.pods:
        h = runner.counter_delta(pod, "prefix_hits")
        q = runner.counter_delta(pod, "prefix_queries")
        if h is not None and q is not None:
            hits, queries = hits + h, queries + q
    return {
        "e2e_values": [round(r.e2e, 6) for r in result.requests if r.ok and r.e2e is not None],
        # not in e2e_values: shown beside the pooled p95, which failures would otherwise flatter
        "failed": sum(1 for r in result.requests if not r.ok),
        # which pod served each request, in the workload's order (to find a pile-up)
        "request_pods": [r.pod for r in result.requests],
        "prefix_hits": hits,
        "prefix_queries": queries,
    }


#: Short names of the variants (--variants), in the order they run.
VARIANTS = ("one", "one-redis", "two-redis", "two-redis-to-one", "two-unshared", "one-again")
DEFAULT_VARIANTS = VARIANTS[:5]


def build_workload(shape: matrix.Shape, quick: bool, seed: int) -> Any:
    """The matrix's workload for `shape` (matrix.build_workload), drawn with `seed`."""
    preset = workloads.PRESETS[shape.preset]
    overrides = {**shape.overrides, **(shape.quick if quick else {})}
    params = workloads.apply_overrides(preset.params, overrides)
    return preset.builder(params, seed=seed, name=shape.key)


def run_shape(
    key: str,
    config: Path,
    quick: bool,
    pods: int,
    address: str,
    out: Path,
    router: bool,
    sync_interval: str | None = None,
    seed: int = 42,
    chosen: Sequence[str] = DEFAULT_VARIANTS,
    trace: bool = False,
) -> dict[str, Any]:
    shape = matrix.SHAPES[key]
    workload = build_workload(shape, quick, seed)
    sim_args = [*workloads.PRESETS[shape.preset].sim_args, *shape.sim_args,
                "--max-num-seqs", str(matrix.SLOTS)]  # fmt: skip
    spec = FleetSpec(pods, "sim-model", sim_args, 1.0, 42, "off", sim_flags())
    with open(config, encoding="utf-8") as f:
        doc = yaml.safe_load(f) or {}
    prefix = f"heimdall:bench-replicas:{uuid.uuid4().hex[:8]}:"
    print(f"== {key}: {workload.describe()}", file=sys.stderr)
    variants: dict[str, tuple[str, dict[str, Any], int, str | None, int | None]] = {
        "one": ("1 replica", doc, 1, None, None),
        "one-redis": ("1 replica + redis", {}, 1, prefix + "a:", None),
        "two-redis": ("2 replicas + redis", {}, 2, prefix + "b:", None),
        "two-redis-to-one": ("2 replicas + redis, all sent to one", {}, 2, prefix + "c:", 1),
        "two-unshared": ("2 replicas, not shared", doc, 2, None, None),
        # the baseline once more, last: how far one replica's p95 moves against itself
        "one-again": ("1 replica, again", doc, 1, None, None),
    }
    rows = []
    for name in chosen:
        label, d, n, kp, senders = variants[name]
        print(f"-- {label}", file=sys.stderr)
        if kp is not None:
            d = shared_config(doc, address, kp, sync_interval)
        try:
            rows.append(
                run_gateways(label, d, n, workload, spec, out / f"{key}-{seed}", senders, trace)
            )
        finally:
            if kp is not None:
                drop_keys(address, kp)
        brief = {k: v for k, v in rows[-1].items() if k not in ("e2e_values", "request_pods")}
        print(f"   {json.dumps(brief)}", file=sys.stderr)
        time.sleep(1.0)
    if router:
        print("-- vllm-router round_robin", file=sys.stderr)
        run = run_target(
            Target("vllm-router", "round_robin"), workload, spec, out / key, progress=False
        )
        row = summarize(
            "vllm-router round_robin", 1, run.result.summary, run.router_cpu, len(workload.requests)
        )
        row.update(samples(run.result))
        rows.append(row)
    return {"shape": key, "description": shape.description, "workload": workload.describe(),
            "seed": seed, "quick": quick, "rows": rows}  # fmt: skip


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def table(result: Mapping[str, Any]) -> list[str]:
    rows = result["rows"]
    base = rows[0]
    lines = [
        f"#### {result['description']}",
        "",
        f"{result['workload']}; workload seed {result.get('seed', 42)}.",
        "",
        "| variant | total (s) | TTFT p95 | E2E p50 | E2E p95 | E2E p95 / 1 replica "
        "| prefix hit rate | hit rate / 1 replica | gateway CPU (s) | CPU ms / request | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        hit, p95 = r["prefix_hit_rate"], r["e2e"]["p95"]
        bhit, bp95 = base["prefix_hit_rate"], base["e2e"]["p95"]
        lines.append(
            f"| {r['label']} | {r['total']:.1f} | {_f(r['ttft']['p95'])} | {_f(r['e2e']['p50'])} "
            f"| {_f(p95)} | {_f(p95 / bp95 if p95 and bp95 else None, '.3f')}x "
            f"| {'n/a' if hit is None else f'{hit:.1%}'} "
            f"| {_f(hit / bhit if hit is not None and bhit else None, '.3f')}x "
            f"| {_f(r['gateway_cpu_s'])} | {_f(r['cpu_ms_per_request'])} | {r['errors']} |"
        )
    return lines


def render(results: Sequence[Mapping[str, Any]], argv: Sequence[str], load: tuple[float, ...],
           started: str, quick: bool = False) -> str:  # fmt: skip
    info = machine.machine_info()
    dirty = " (dirty)" if machine.git_dirty("heimdall_proxy", "bench") else ""
    head = [
        f"Command: `python -m bench.replicas {' '.join(argv)}`; {started}; commit "
        f"{machine.git_head()}{dirty}; "
        f"{info.get('cpu', '')} {info.get('arch', '')}, {os.cpu_count()} cores; load average "
        f"{load[0]:.2f} at the start, {load[1]:.2f} at the end.",
        "",
    ]
    body: list[str] = []
    for r in results:
        body += [*table(r), ""]
    if len(results) > 1:
        body += [*summary(results), ""]
    if len({r.get("seed", 42) for r in results}) > 1:
        body += [*spread(results), ""]
        body += [*pooled_lines(results), ""]
    body += [*same_pod(results, quick), ""]
    return "\n".join(head + body)


def summary(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every run's ratios to its own first variant, one line per shape and seed."""
    labels = [r["label"] for r in results[0]["rows"][1:]]
    lines = [
        "#### Every run: E2E p95 and prefix hit rate against the first variant",
        "",
        "| shape | seed | " + " | ".join(f"{lb}: p95 / hit" for lb in labels) + " |",
        "|---|---:|" + "---:|" * len(labels),
    ]
    for result in results:
        base = result["rows"][0]
        cells = []
        for row in result["rows"][1:]:
            p95, hit = row["e2e"]["p95"], row["prefix_hit_rate"]
            bp95, bhit = base["e2e"]["p95"], base["prefix_hit_rate"]
            cells.append(
                f"{_f(p95 / bp95 if p95 and bp95 else None, '.3f')}x / "
                f"{_f(hit / bhit if hit is not None and bhit else None, '.3f')}x"
            )
        lines.append(
            f"| {result['shape']} | {result.get('seed', 42)} | " + " | ".join(cells) + " |"
        )
    return lines


def ratios(result: Mapping[str, Any], row: Mapping[str, Any]) -> tuple[float, float] | None:
    """(E2E p95, prefix hit rate) of `row` over the result's first row, None if missing."""
    base = result["rows"][0]
    p95, hit = row["e2e"]["p95"], row["prefix_hit_rate"]
    bp95, bhit = base["e2e"]["p95"], base["prefix_hit_rate"]
    if not (p95 and bp95 and hit is not None and bhit):
        return None
    return p95 / bp95, hit / bhit


def spread(results: Sequence[Mapping[str, Any]], limit: float = 0.05) -> list[str]:
    """Per shape and variant, over the seeds: median and range of the ratios to the first
    variant, and how many seeds fall outside 1 +- `limit`. A single replica run again
    ("1 replica, again") shows how far the ratio moves with no change at all: the noise
    the other variants' spread is to be read against."""
    by: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for result in results:
        for row in result["rows"][1:]:
            r = ratios(result, row)
            if r is not None:
                by.setdefault((result["shape"], row["label"]), []).append(r)
    lines = [
        "#### Over the seeds: ratios to the first variant, median [min, max]",
        "",
        f"| shape | variant | seeds | E2E p95 | p95 outside 1 +- {limit:g} "
        f"| prefix hit rate | hit outside 1 +- {limit:g} |",
        "|---|---|---:|---|---:|---|---:|",
    ]
    for (shape, label), values in by.items():
        cells = []
        for i in (0, 1):
            v = sorted(x[i] for x in values)
            out = sum(1 for x in v if abs(x - 1.0) > limit)
            cells += [f"{statistics.median(v):.3f}x [{v[0]:.3f}, {v[-1]:.3f}]", str(out)]
        lines.append(f"| {shape} | {label} | {len(values)} | " + " | ".join(cells) + " |")
    return lines


#: Send-time gaps (s) between consecutive requests that same_pod() groups by.
GAP_EDGES = (0.0, 0.005, 0.010, 0.020, float("inf"))


def same_pod_counts(
    offsets: Sequence[float], pods: Sequence[str | None], edges: Sequence[float] = GAP_EDGES
) -> list[tuple[int, int]]:
    """Per gap bucket, (pairs of consecutive requests, pairs sent to the same pod). Dealt in
    turn, consecutive requests reach different replicas of a pair: within the time a
    request takes to reach the other replica's view, the two can pick the same pod where
    one gateway, seeing the first in flight, would not."""
    out = [(0, 0)] * (len(edges) - 1)
    for i in range(1, len(offsets)):
        gap = offsets[i] - offsets[i - 1]
        b = next(k for k in range(len(edges) - 1) if edges[k] <= gap < edges[k + 1])
        n, same = out[b]
        out[b] = (n + 1, same + (pods[i] is not None and pods[i] == pods[i - 1]))
    return out


def same_pod(results: Sequence[Mapping[str, Any]], quick: bool = False) -> list[str]:
    """same_pod_counts per shape and variant, summed over the runs that kept each request's
    pod (the workload is drawn again from its seed for the send offsets)."""
    by: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for result in results:
        # the workload as the run drew it (runs before "quick" was kept: as asked now)
        workload = build_workload(
            matrix.SHAPES[result["shape"]], result.get("quick", quick), result.get("seed", 42)
        )
        offsets = sorted(r.offset for r in workload.requests)
        for row in result["rows"]:
            pods = row.get("request_pods")
            if not pods or len(pods) != len(offsets):
                continue  # kept no pods, or not this workload
            counts = same_pod_counts(offsets, pods)
            acc = by.setdefault((result["shape"], row["label"]), [(0, 0)] * len(counts))
            by[(result["shape"], row["label"])] = [
                (a + n, b + s) for (a, b), (n, s) in zip(acc, counts, strict=True)
            ]
    if not by:
        return []
    heads = [
        f"{GAP_EDGES[k] * 1000:g}-{GAP_EDGES[k + 1] * 1000:g} ms" for k in range(len(GAP_EDGES) - 1)
    ]
    lines = [
        "#### Consecutive requests sent to the same pod, by the gap between their sends",
        "",
        "| shape | variant | " + " | ".join(heads) + " |",
        "|---|---|" + "---:|" * len(heads),
    ]
    for (shape, label), counts in by.items():
        cells = [f"{s}/{n} ({s / n:.0%})" if n else "-" for n, s in counts]
        lines.append(f"| {shape} | {label} | " + " | ".join(cells) + " |")
    return lines


def pooled_lines(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The pooled table (bench/harness/stats.py), or why there is none: runs before per-request
    latencies were kept in the JSON cannot be pooled."""
    found = stats.pool(results)
    if not found:
        return ["(no pooled figures: these runs' JSON has no per-request latencies)"]
    return stats.table(found)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    cli.add_quick(parser, "the matrix's smaller workloads")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--config", type=Path, default=Path("config/recommended.yaml"))
    cli.add_pods(parser)
    cli.add_redis(parser)
    parser.add_argument("--sync-interval", help="syncInterval of the shared plugins (a duration)")
    parser.add_argument("--no-router", action="store_true", help="skip vllm-router round_robin")
    parser.add_argument(
        "--seeds",
        default="42",
        help="comma-separated workload seeds: one run of every shape per seed",
    )
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, from {', '.join(VARIANTS)}; the first is the "
        "baseline of the ratios",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="gateways at -v 3: the affinity filter's per-decision trace in "
        "their logs (bench/probes/replica_trace.py reads it)",
    )
    cli.add_output(parser, out_dir="replicas")
    parser.add_argument(
        "--spread",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: print the per-seed ratios and their spread of earlier runs' --json",
    )
    args = parser.parse_args(argv)
    if args.spread:
        loaded = [r for path in args.spread for r in json.loads(path.read_text())]
        lines = [*summary(loaded), "", *spread(loaded), "", *pooled_lines(loaded)]
        print("\n".join([*lines, "", *same_pod(loaded, args.quick)]))
        return 0
    raw = list(sys.argv[1:] if argv is None else argv)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load0 = os.getloadavg()[0]
    results = [
        run_shape(
            key,
            args.config,
            args.quick,
            args.pods,
            args.redis,
            args.out_dir,
            not args.no_router,
            args.sync_interval,
            int(seed),
            args.variants.split(","),
            args.trace,
        )
        for seed in args.seeds.split(",")
        for key in args.shapes.split(",")
    ]
    text = render(results, raw, (load0, os.getloadavg()[0]), started, args.quick)
    print(text)
    cli.write_markdown(args.markdown, text, printed=True)
    cli.write_json(args.json, results, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
