"""The routing matrix: every target on every traffic shape that breaks routers.

Shapes (issue 12): (a) hot prefix, one system prompt taking half the traffic, near
saturation; (b) cold heterogeneous burst (seed 001's shape, no shared prefixes); (c) many-
prefix multi-turn chat; (d) mixed long and short contexts, sessions and two LoRA adapters;
(e) the mixed traffic on pods of unequal speed (two of four at half speed). Every pod has two
request slots (`--max-num-seqs 2`), as the issue's capacity-limited stand-ins did, so that the
workload's lower bound on total wall-clock is well defined:

    lower bound = total pod work / total pod speed

A request's pod work is what the simulator's own cost model charges a pod for it: every
prompt token it prefills (a pod's prefill compute is not multiplied by its slots: a step
costs the sum of its tokens) and its per-sequence decode costs in full, and each step's fixed
cost shared by the `slots` sequences one step can carry. A slow pod counts at its speed; no
run can end before the last request is sent either, so the bound is the larger of the two.
(Until 2026-11-24 the bound divided each request's time alone on a pod by the slot count, as
if a pod prefilled two prompts in the time of one: 6% too low on the cold burst.)
Two bounds are reported: with every prompt computed cold, and with each distinct prompt
block computed once fleet-wide (the best any cache-aware router could do); each target's
ratio is to the cached bound, the tighter one.

Issue 36 added shapes (g)-(i) from real traces and inference-perf's shared-prefix workload
(bench/traces/README.md, bench/harness/workloads.py) and, beside the bound, the oracle
(bench/harness/oracle.py): the same pods simulated with a greedy dispatcher that knows every
pod's queue and cache; each target's E2E mean and p95 are also given as ratios to its.

Every target of a shape gets the same request schedule (fixed seed) on a fresh fleet.

    python -m bench.matrix --quick                    # a few minutes per shape on 2 cores
    python -m bench.matrix --shapes hot-prefix,cold-burst \\
        --targets round_robin config/recommended.yaml
    python -m bench.matrix --json bench/out/matrix.json --markdown bench/out/matrix.md
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import cli, machine, oracle, runner
from bench.harness.costs import SLOTS, options_from_flags, pod_work, service_time
from bench.harness.pods import FleetSpec, sim_flags
from bench.harness.targets import Target, TargetRun, parse_target, run_target
from bench.harness.workloads import PRESETS, Workload, apply_overrides
from heimdall_proxy.sim.options import SimOptions

SLOW = ("--step-base", "0.016", "--prefill-cost-per-token", "0.00012",
        "--decode-cost-per-seq", "0.0003")  # fmt: skip
SLOW_FACTOR = 0.5

DEFAULT_TARGETS = (
    "round_robin",
    "cache_aware",
    "config/recommended.yaml",
    "config/load-aware.yaml",
    "config/work-aware.yaml",
    "config/prefix-cache.yaml",
)


@dataclass(frozen=True)
class Shape:
    key: str
    description: str
    preset: str
    overrides: dict[str, str]
    quick: dict[str, str]
    sim_args: tuple[str, ...] = ()
    #: per-pod flags, cycled over the pods, and each pod's speed relative to the default
    per_pod: tuple[tuple[tuple[str, ...], float], ...] = ()


SHAPES: dict[str, Shape] = {
    s.key: s
    for s in (
        Shape("hot-prefix", "(a) hot prefix: 5 system prompts, one takes half, near saturation",
              "hot-prefix", {"rate": "10"}, {"requests": "140"}),
        Shape("cold-burst", "(b) cold heterogeneous burst: seed 001's shape, every prompt distinct",
              "seed001-small", {}, {"total": "100", "heavy_seeds": "50"},
              ("--num-gpu-blocks", "1024")),
        Shape("multi-turn", "(c) many-prefix multi-turn chat: 8 system prompts, 48 users x 5 turns",
              "chat-prefix-small",
              {"users": "48", "system_prompts": "8", "system_words": "1500",
               "think_time": "1,3", "ramp": "10"},
              {"users": "28"}),
        Shape("mixed", "(d) mixed: sessions on a base model and 2 LoRA adapters (1 resident), "
              "short and long prompts", "mixed", {"rate": "9"}, {"requests": "140"}),
        Shape("unequal", "(e) the mixed traffic on unequal pods: pods 2 and 3 at half speed",
              "mixed", {"rate": "7"}, {"requests": "140"},
              per_pod=(((), 1.0), ((), 1.0), (SLOW, SLOW_FACTOR), (SLOW, SLOW_FACTOR))),
        # issue 33: load-aware.yaml lost to round-robin on an all-cold burst of heavy and
        # light prompts; every prompt here is unique, and the sizes span 20x
        Shape("cold-mixed", "(f) all-cold mixed burst: every prompt unique, 256 to 5,120 "
              "tokens (20x), above capacity", "context-mix",
              {"rate": "40", "mix": "0.5,0.3,0.2", "short_tokens": "256,512",
               "medium_tokens": "1024,2048", "long_tokens": "4096,5120",
               "output_tokens": "16,64"},
              {"requests": "120"}),
        # issue 36: real traces (bench/traces/README.md) and inference-perf's shared prefix,
        # each time scaled so its work is 80% of the 4 pods' capacity (workloads.py)
        Shape("mooncake-conversation", "(g) Mooncake's conversation trace: a sample of whole "
              "conversations, hash ids as shared 512-token blocks, 80% load",
              "mooncake-conversation", {}, {"conversations": "60"}),
        Shape("mooncake-synthetic", "(h) Mooncake's synthetic trace (public datasets, Poisson "
              "arrivals): a sample of whole conversations, 80% load",
              "mooncake-synthetic", {}, {"conversations": "60"}),
        Shape("shared-prefix", "(i) inference-perf's shared prefix: 8 groups x 12 users, "
              "2,000-token system prompts, 200-token questions, multi-turn, 80% load",
              "shared-prefix", {}, {"rounds": "2"}),
    )
}  # fmt: skip


# ---- the lower bound --------------------------------------------------------------------


@dataclass
class LowerBound:
    cold: float
    cached: float
    capacity: float
    last_send: float
    #: what the best immediate-dispatch router achieves: each request sent on arrival to the
    #: pod that would finish it first, knowing every service time exactly (cold prefill)
    greedy: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {"cold": self.cold, "cached": self.cached, "capacity_pods": self.capacity,
                "last_send": self.last_send, "greedy_dispatch": self.greedy}  # fmt: skip


def greedy_dispatch(
    jobs: Sequence[tuple[float, float]], speeds: Sequence[float], slots: int = SLOTS
) -> float:
    """Makespan of (arrival, service) jobs dispatched on arrival, each to the pod whose
    earliest-free slot would finish it first; pods run `slots` requests at a time, FIFO."""
    free = [[0.0] * slots for _ in speeds]
    end = 0.0
    for arrival, service in jobs:
        best = min(
            range(len(speeds)),
            key=lambda p: max(arrival, min(free[p])) + service / speeds[p],
        )
        i = min(range(slots), key=lambda k: free[best][k])
        free[best][i] = max(arrival, free[best][i]) + service / speeds[best]
        end = max(end, free[best][i])
    return end


def lower_bound(
    workload: Workload,
    speeds: Sequence[float],
    slots: int = SLOTS,
    requests: Sequence[oracle.OracleRequest] | None = None,
) -> LowerBound:
    o = SimOptions()
    reqs = oracle.requests_of(workload) if requests is None else requests
    # blocks keyed by their chain hash (the model folded in): computed once fleet-wide at best
    seen: set[int] = set()
    cold = cached = 0.0
    jobs: list[tuple[float, float]] = []
    for r in reqs:
        hits = 0
        for b, key in enumerate(r.blocks):
            if key in seen and hits == b:
                hits += 1
            seen.add(key)
        cold += pod_work(r.prompt, 0, r.output, o, slots)
        cached += pod_work(r.prompt, hits * o.block_size, r.output, o, slots)
        jobs.append((r.arrival, service_time(r.prompt, 0, r.output, o)))
    capacity = sum(speeds)
    last = workload.duration
    return LowerBound(
        max(cold / capacity, last),
        max(cached / capacity, last),
        capacity,
        last,
        greedy_dispatch(jobs, speeds, slots),
    )


def pod_options(shape: Shape, pods: int) -> list[SimOptions]:
    """Each pod's options as the fleet starts it: the preset's and the shape's flags, then
    its own (unequal pods)."""
    base = [*PRESETS[shape.preset].sim_args, *shape.sim_args]
    per_pod = list(shape.per_pod) or [((), 1.0)]
    return [options_from_flags([*base, *per_pod[i % len(per_pod)][0]]) for i in range(pods)]


def speeds_of(shape: Shape, pods: int) -> list[float]:
    per_pod = list(shape.per_pod) or [((), 1.0)]
    return [per_pod[i % len(per_pod)][1] for i in range(pods)]


def bounds(shape: Shape, workload: Workload, pods: int) -> tuple[LowerBound, oracle.OracleResult]:
    """The lower bound and the oracle's run (bench/harness/oracle.py) of a shape's workload."""
    reqs = oracle.requests_of(workload)
    bound = lower_bound(workload, speeds_of(shape, pods), requests=reqs)
    return bound, oracle.simulate(reqs, pod_options(shape, pods))


# ---- running a shape ----------------------------------------------------------------------


@dataclass
class ShapeResult:
    shape: Shape
    workload: Workload
    bound: LowerBound
    oracle: oracle.OracleResult
    runs: list[TargetRun] = field(default_factory=list)
    #: targets that could not run on this shape, with why (the table says so; the rest run)
    not_run: dict[str, str] = field(default_factory=dict)


#: The request schedule's seed unless --seed says otherwise (every figure in RESULTS before
#: 2026-11-28 used it).
DEFAULT_SEED = 42


def build_workload(
    shape: Shape, quick: bool, seed: int = DEFAULT_SEED, extra: dict[str, str] | None = None
) -> Workload:
    """A shape's workload; `extra` overrides its parameters last (e.g. a trace's path)."""
    preset = PRESETS[shape.preset]
    overrides = {**shape.overrides, **(shape.quick if quick else {}), **(extra or {})}
    params = apply_overrides(preset.params, overrides)
    return preset.builder(params, seed=seed, name=shape.key)


def run_shape(
    shape: Shape,
    targets: Sequence[Target],
    quick: bool,
    pods: int,
    out: Path,
    seed: int = DEFAULT_SEED,
    extra: dict[str, str] | None = None,
) -> ShapeResult:
    workload = build_workload(shape, quick, seed, extra)
    per_pod = list(shape.per_pod) or [((), 1.0)]
    result = ShapeResult(shape, workload, *bounds(shape, workload, pods))
    supported = sim_flags()
    sim_args = [*PRESETS[shape.preset].sim_args, *shape.sim_args, "--max-num-seqs", str(SLOTS)]
    spec = FleetSpec(
        pods, "sim-model", sim_args, 1.0, seed, "off", supported,
        per_pod_args=[list(a) for a, _ in per_pod] if shape.per_pod else [],
    )  # fmt: skip
    print(f"== {shape.key}: {workload.describe()}", file=sys.stderr)
    for i, target in enumerate(targets):
        if i:
            time.sleep(1.0)
        print(f"-- {target.label}", file=sys.stderr)
        # KV events only for a target that reads them (the precise scorer): fewer sockets and
        # less CPU on the 2-core machine for the others, whatever else runs beside it
        spec = dataclasses.replace(spec, kv_events="auto" if "precise" in target.arg else "off")
        try:
            run = run_target(target, workload, spec, out / shape.key, progress=False)
        except RuntimeError as exc:  # a pod or router that failed to start (a port race)
            print(f"   failed to start, trying once more: {exc}", file=sys.stderr)
            time.sleep(2.0)
            try:
                run = run_target(target, workload, spec, out / shape.key, progress=False)
            except RuntimeError as again:  # HarnessError included: a missing tool
                result.not_run[target.label] = _first_line(again)
                print(f"   not run: {again}", file=sys.stderr)
                continue
        print(runner.format_summary(run.result.summary), file=sys.stderr)
        result.runs.append(run)
    return result


def _first_line(exc: BaseException) -> str:
    """An exception's first line, for a table cell (the log holds the rest)."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__).replace("|", "/")[:160]


# ---- the report ---------------------------------------------------------------------------


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def table(shape: dict[str, Any]) -> list[str]:
    """One shape's markdown table, from its entry in the summary JSON."""
    b = shape["lower_bound"]
    targets: dict[str, dict[str, Any]] = shape["targets"]
    rr = targets.get("vllm-router round_robin")
    rr = None if rr is None or "not_run" in rr else rr
    rr_total = rr["total"] if rr else None
    rr_p95 = rr["e2e"]["p95"] if rr else None
    greedy = b.get("greedy_dispatch")
    best = (
        f" For scale: a router that sends each request on arrival to the slot that would finish "
        f"it first, knowing every time alone exactly and ignoring that a pod's prefills slow "
        f"its other slot, would take {greedy:.1f} s ({greedy / b['cached']:.2f}x the bound)."
        if greedy
        else ""
    )
    orc = shape.get("oracle")
    o_mean = orc["e2e_mean"] if orc else None
    o_p95 = orc["e2e_p95"] if orc else None
    oracle_line = (
        f" The oracle (a simulation of these pods, each request sent on arrival to the pod "
        f"that would finish it first, knowing every pod's queue and cache: "
        f"bench/harness/oracle.py): E2E mean **{orc['e2e_mean']:.2f} s**, p95 "
        f"**{orc['e2e_p95']:.2f} s**, total {orc['total']:.1f} s, prefix hit rate "
        f"{orc['prefix_hit_rate']:.1%}."
        if orc
        else ""
    )
    lines = [
        f"### {shape['description']}",
        "",
        f"{shape['workload']}. Lower bound on total (the larger of the pod work / "
        f"{b['capacity_pods']:g} pods' speed and the last send): {b['cold']:.1f} s with every "
        "prompt "
        f"computed, **{b['cached']:.1f} s** with each distinct prompt block computed once (the "
        f"ratio column uses this one).{best}{oracle_line}",
        "",
        "| target | total (s) | / bound | E2E mean / oracle | E2E p95 / oracle | / RR "
        "| TTFT p50 | TTFT p95 | TTFT p99 | E2E mean | E2E p50 | E2E p95 | E2E p99 "
        "| E2E p95 / RR | prefix hit rate | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, t in targets.items():
        if "not_run" in t:
            lines.append(f"| {label} | not run: {t['not_run']} |" + " |" * 15)
            continue
        total = t["total"]
        rate = t.get("prefix_hit_rate")
        p95 = t["e2e"]["p95"]
        mean = t["e2e"].get("mean")
        lines.append(
            f"| {label} | {total:.1f} | {total / b['cached']:.2f}x "
            f"| {_x(mean / o_mean if mean and o_mean else None)} "
            f"| {_x(p95 / o_p95 if p95 and o_p95 else None)} "
            f"| {_x(total / rr_total if rr_total else None)} "
            f"| {_f(t['ttft']['p50'])} | {_f(t['ttft']['p95'])} | {_f(t['ttft']['p99'])} "
            f"| {_f(mean)} | {_f(t['e2e']['p50'])} | {_f(t['e2e']['p95'])} "
            f"| {_f(t['e2e']['p99'])} "
            f"| {_x(p95 / rr_p95 if p95 and rr_p95 else None)} "
            f"| {'n/a' if rate is None else f'{rate:.1%}'} | {t['errors']} |"
        )
    return lines


_SHAPE_NAMES = {
    "mooncake-conversation": "(g) Mooncake conversation",
    "mooncake-synthetic": "(h) Mooncake synthetic",
    "shared-prefix": "(i) inference-perf shared prefix",
}


def oracle_table(doc: dict[str, Any]) -> list[str]:
    """One table of every shape with an oracle: each target's E2E mean and p95 over the
    oracle's, total over the cached bound, prefix hit rate and errors (RESULTS.md, issue 36)."""
    lines = [
        "| shape | target | E2E mean / oracle | E2E p95 / oracle | total / bound "
        "| prefix hit rate | errors |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, shape in doc["shapes"].items():
        orc = shape.get("oracle")
        if not orc:
            continue
        name = _SHAPE_NAMES.get(key, key)
        cached = shape["lower_bound"]["cached"]
        lines.append(
            f"| {name} | oracle (simulated) | {orc['e2e_mean']:.2f} s | {orc['e2e_p95']:.2f} s "
            f"| {orc['total'] / cached:.2f}x | {orc['prefix_hit_rate']:.1%} | - |"
        )
        for label, t in shape["targets"].items():
            short = label.removeprefix("vllm-router ").removeprefix("heimdall-proxy ")
            if "not_run" in t:
                lines.append(f"| {name} | {short} | not run: {t['not_run']} | | | | |")
                continue
            mean, p95 = t["e2e"].get("mean"), t["e2e"].get("p95")
            rate = t.get("prefix_hit_rate")
            lines.append(
                f"| {name} | {short} | {_x(mean / orc['e2e_mean'] if mean else None)} "
                f"| {_x(p95 / orc['e2e_p95'] if p95 else None)} | {_x(t['total'] / cached)} "
                f"| {'n/a' if rate is None else f'{rate:.1%}'} | {t['errors']} |"
            )
    return lines


def merge(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several summaries of one schedule (split invocations) as one: shapes in first-seen
    order, each shape's targets in file order (a later file's run of a target replaces an
    earlier one's). Refuses summaries of different schedules (mode, seed or pods)."""
    out: dict[str, Any] = {"shapes": {}}
    for doc in docs:
        for key in ("mode", "seed", "pods"):
            if key in doc and out.setdefault(key, doc[key]) != doc[key]:
                raise ValueError(f"summaries differ in {key}: {out[key]!r} and {doc[key]!r}")
        out.setdefault("machine", doc.get("machine"))
        for key, shape in doc["shapes"].items():
            into = out["shapes"].setdefault(key, {**shape, "targets": {}})
            into["targets"].update(shape["targets"])
    return out


def render(doc: dict[str, Any], header: str = "") -> str:
    """Markdown tables for a summary JSON (a fresh run's, or one loaded with --render)."""
    lines = [header, ""] if header else []
    for shape in doc["shapes"].values():
        lines += [*table(shape), ""]
    return "\n".join(lines)


def _oracle_ratios(summary: dict[str, Any], orc: oracle.OracleResult) -> dict[str, Any]:
    e2e = summary["e2e"]
    return {
        "e2e_mean": e2e["mean"] / orc.mean() if e2e.get("mean") and orc.mean() else None,
        "e2e_p95": e2e["p95"] / orc.p95() if e2e.get("p95") and orc.p95() else None,
        "total": summary["wall_clock"] / orc.total if orc.total else None,
    }


def summary_json(results: Sequence[ShapeResult]) -> dict[str, Any]:
    doc: dict[str, Any] = {"machine": machine.machine_info(), "shapes": {}}
    for res in results:
        doc["shapes"][res.shape.key] = {
            "description": res.shape.description,
            "workload": res.workload.describe(),
            "lower_bound": res.bound.to_json(),
            "oracle": res.oracle.to_json(),
            "targets": {
                run.target.label: {
                    "total": run.result.summary["wall_clock"],
                    "ratio_to_bound": run.result.summary["wall_clock"] / res.bound.cached,
                    "ratio_to_oracle": _oracle_ratios(run.result.summary, res.oracle),
                    "ttft": run.result.summary["ttft"],
                    "e2e": run.result.summary["e2e"],
                    "prefix_hit_rate": run.result.summary.get("prefix_hit_rate"),
                    "errors": run.result.summary["errors"],
                    "router_cpu_seconds": run.router_cpu,
                }
                for run in res.runs
            },
        }
        doc["shapes"][res.shape.key]["targets"].update(
            {label: {"not_run": why} for label, why in res.not_run.items()}
        )
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    cli.add_quick(parser)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--targets", nargs="+", default=list(DEFAULT_TARGETS))
    cli.add_pods(parser)
    cli.add_seed(
        parser,
        DEFAULT_SEED,
        "the request schedule's (and the pods') seed: repeat a claim on other draws",
    )
    cli.add_output(parser, out_dir="matrix")
    parser.add_argument(
        "--trace-file",
        action="append",
        default=[],
        metavar="SHAPE=PATH",
        help="replay a trace shape from this file (a full Mooncake trace is sampled as the "
        "committed sample was: bench/traces/README.md), e.g. "
        "mooncake-conversation=conversation_trace.jsonl",
    )
    parser.add_argument(
        "--bound-only", action="store_true", help="print the bounds and the oracle, run nothing"
    )
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="print the tables of saved summaries (several: one schedule split over "
        "invocations, merged; bounds and oracle recomputed), run nothing",
    )
    parser.add_argument(
        "--brief",
        action="store_true",
        help="with --render: only the table of every shape against the oracle",
    )
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.shapes.split(",") if k.strip()]
    unknown = [k for k in keys if k not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    extra: dict[str, dict[str, str]] = {}
    for item in args.trace_file:
        key, sep, path = item.partition("=")
        if not sep or key not in SHAPES or not SHAPES[key].preset.startswith("mooncake"):
            parser.error(f"--trace-file takes TRACE-SHAPE=PATH, got {item!r}")
        extra[key] = {"path": path}
    if args.render:
        try:
            doc = merge([json.loads(p.read_text(encoding="utf-8")) for p in args.render])
        except ValueError as exc:
            parser.error(str(exc))
        order = list(SHAPES)  # the matrix's order, whichever file named a shape first
        doc["shapes"] = dict(
            sorted(
                doc["shapes"].items(),
                key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order),
            )
        )
        for key, shape in doc["shapes"].items():
            if key in SHAPES:  # today's bound and oracle models
                spec = SHAPES[key]
                quick = "quick" in str(doc.get("mode", ""))
                wl = build_workload(spec, quick, doc.get("seed", DEFAULT_SEED))
                bound, orc = bounds(spec, wl, doc.get("pods", 4))
                shape["lower_bound"] = bound.to_json()
                shape["oracle"] = orc.to_json()
        print("\n".join(oracle_table(doc)) if args.brief else render(doc))
        return 0
    if args.bound_only:
        for k in keys:
            shape = SHAPES[k]
            wl = build_workload(shape, args.quick, args.seed, extra.get(k))
            bound, orc = bounds(shape, wl, args.pods)
            print(k, wl.describe(), bound.to_json(), "oracle", orc.to_json())
        return 0
    targets = [parse_target(t) for t in args.targets]
    started = dt.datetime.now(dt.UTC)
    load_before = os.getloadavg()[0]
    results = [
        run_shape(SHAPES[k], targets, args.quick, args.pods, args.out_dir, args.seed, extra.get(k))
        for k in keys
    ]
    cmd = "python -m bench.matrix " + " ".join(argv if argv is not None else sys.argv[1:])
    m = machine.machine_info()
    head = [
        f"Run {started:%Y-%m-%d %H:%M} UTC with `{cmd.strip()}`; machine: {m}; 1-minute load "
        f"average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after (2 shared cores: "
        "compare ratios within a table, not absolute seconds across tables). Latencies in "
        f"seconds; {args.pods} fresh simulated pods per target, {SLOTS} request slots each.",
        "",
    ]
    doc = summary_json(results)
    text = render(doc, "\n".join(head).strip())
    print(text)
    cli.write_markdown(args.markdown, text, printed=True)
    doc.update(mode="quick" if args.quick else "full", pods=args.pods, seed=args.seed)
    cli.write_json(args.json, doc, indent=1)
    clean = all(r.result.summary["errors"] == 0 for s in results for r in s.runs)
    return 0 if clean and not any(s.not_run for s in results) else 2


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
