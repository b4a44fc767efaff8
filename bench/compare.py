"""Compare routers on one workload, each in front of its own fresh simulated fleet.

For every target, N simulated vLLM pods (``heimdall-proxy sim`` subprocesses) are started on
free loopback ports, the router is started in front of them, the workload is replayed open-loop
(bench/harness/runner.py) while the pods' /metrics are polled, then everything is stopped. A
new fleet per target means every target starts with empty queues and caches.

Targets:

* ``round_robin``, ``cache_aware`` (or any ``vllm-router:POLICY``): vllm-router from PyPI
  (``pip install vllm-router``), ``--policy POLICY --worker-urls <pods>``;
* ``gateway:PATH`` (or just a ``.yaml`` path): ``heimdall-proxy serve`` on a copy of the config
  whose ``endpoints:`` are replaced by the simulated pods (plugins, profiles and feature gates
  are kept; pod i takes the labels of the config's endpoint i modulo their number).

    python -m bench.compare --workload seed001-small --pods 4 \\
        --targets round_robin gateway:config/recommended.yaml

Writes per-target result JSON and logs under ``--out-dir`` (bench/out/<workload>/), a PNG of
per-pod queues per target into ``--plots-dir`` (bench/plots/) and a section for the workload in
``--results FILE`` when given (replacing that workload's marked section there); it is printed
either way.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import os
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.harness import cli, runner
from bench.harness.machine import BENCH_DIR, machine_info
from bench.harness.pods import FleetSpec, sim_extra, sim_flags, split_sim_args
from bench.harness.targets import TargetRun, parse_target, run_target
from bench.harness.workloads import PRESETS, Workload, add_workload_args, workload_from_args


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def results_table(runs: Sequence[TargetRun]) -> list[str]:
    lines = [
        "| target | wall-clock (s) | TTFT p50 | TTFT p95 | TTFT p99 | E2E p50 | E2E p95 "
        "| E2E p99 | errors | prefix hit rate | pods drained, first / last (s) | router CPU (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run.result.summary
        rate = s.get("prefix_hit_rate")
        drained = s.get("pods_drained")
        drain = f"{drained['first']:.1f} / {drained['last']:.1f}" if drained else "-"
        lines.append(
            f"| {run.target.label} | {s['wall_clock']:.1f} "
            f"| {_s(s['ttft']['p50'])} | {_s(s['ttft']['p95'])} | {_s(s['ttft']['p99'])} "
            f"| {_s(s['e2e']['p50'])} | {_s(s['e2e']['p95'])} | {_s(s['e2e']['p99'])} "
            f"| {s['errors']} | {'n/a' if rate is None else f'{rate:.1%}'} "
            f"| {drain} "
            f"| {_s(run.router_cpu, 1)} |"
        )
    return lines


def by_tag_table(runs: Sequence[TargetRun]) -> list[str]:
    tags = sorted({t for run in runs for t in run.result.summary["by_tag"]})
    head = "| target | " + " | ".join(f"{t} E2E p50 / p95 (s)" for t in tags) + " |"
    lines = [head, "|---|" + "---:|" * len(tags)]
    for run in runs:
        by_tag = run.result.summary["by_tag"]
        cells = []
        for t in tags:
            e2e = by_tag.get(t, {}).get("e2e", {})
            cells.append(f"{_s(e2e.get('p50'))} / {_s(e2e.get('p95'))}")
        lines.append(f"| {run.target.label} | " + " | ".join(cells) + " |")
    return lines


def per_pod_table(runs: Sequence[TargetRun]) -> list[str]:
    """Requests and output tokens each pod served (from the x-sim-pod response header)."""
    pods = sorted({p for run in runs for p in run.result.summary.get("requests_per_pod", {})})
    if not pods:
        return []
    lines = [
        "Requests / output tokens per pod:",
        "",
        "| target | " + " | ".join(pods) + " |",
        "|---|" + "---:|" * len(pods),
    ]
    for run in runs:
        reqs = run.result.summary.get("requests_per_pod", {})
        toks = run.result.summary.get("output_tokens_per_pod", {})
        cells = [f"{reqs.get(p, 0)} / {toks.get(p, 0) / 1000:.1f}k" for p in pods]
        lines.append(f"| {run.target.label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def section_markers(workload: str) -> tuple[str, str]:
    return f"<!-- routing:{workload}:begin -->", f"<!-- routing:{workload}:end -->"


def render_section(
    workload: Workload,
    runs: Sequence[TargetRun],
    *,
    command: str,
    machine: Mapping[str, str],
    spec: FleetSpec,
    dropped: Sequence[str],
    plot: str | None,
    notes: Sequence[str] = (),
) -> str:
    begin, end = section_markers(workload.name)
    m = machine
    scale = spec.time_scale
    lines = [
        begin,
        f"## Routing: {workload.name}",
        "",
        f"Run {dt.date.today().isoformat()} with:",
        "",
        "```sh",
        command,
        "```",
        "",
        f"- Machine: {m['arch']}, {m['nproc']} CPUs ({m['cpu']}), {m['os']}, "
        f"Python {m['python']}; heimdall-proxy at `{m['commit']}`, "
        f"vllm-router {m['vllm_router']}.",
        f"- Workload: {workload.describe()}" + (f" (offsets x{scale:g})." if scale != 1 else "."),
        f"- Fleet: {spec.pods} fresh simulated pods per target, each "
        f"`{shlex.join(['heimdall-proxy', 'sim', '--model', spec.model, *sim_extra(spec)])}`.",
    ]
    kv_targets = [r.target.label for r in runs if spec.kv_events_for(r.target)]
    if kv_targets:
        lines.append(
            f"- KV events on for {', '.join(kv_targets)}: each pod also had `--kv-events-port` "
            "(and `--kv-events-replay-port`) and the gateway config `kvEvents:` pointing at it."
        )
    if dropped:
        lines.append(f"- Not supported by this simulator, so not passed: `{' '.join(dropped)}`.")
    for run in runs:
        if run.result.meta.get("profiles"):
            lines.append(f"- {run.target.label} profiles: {run.result.meta['profiles']}.")
    lines += [f"- {note}" for note in notes]
    lines += ["", "Latencies in seconds.", "", *results_table(runs), "", *by_tag_table(runs), ""]
    lines += per_pod_table(runs)
    if plot:
        lines += [f"![per-pod queue and running requests over time]({plot})", ""]
    lines.append(end)
    return "\n".join(lines) + "\n"


def write_section(path: Path, workload_name: str, section: str) -> None:
    """Replace the workload's section in `path` (markers), or append one; keep the rest."""
    begin, end = section_markers(workload_name)
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


def auto_notes(runs: Sequence[TargetRun], spec: FleetSpec) -> list[str]:
    notes = []
    if "--time-scale" not in spec.supported and spec.time_scale != 1:
        notes.append(
            "The simulator has no `--time-scale`: pods ran at their own speed; only the "
            "workload's send offsets were scaled."
        )
    if all(run.result.summary.get("prefix_hit_rate") is None for run in runs):
        notes.append(
            "Prefix hit rate n/a: the pods expose no `vllm:prefix_cache_queries_total` / "
            "`vllm:prefix_cache_hits_total` counters (or saw no queries)."
        )
    return notes


# ---- main ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser(
        "Run one workload through several routers, each on a fresh simulated fleet."
    )
    add_workload_args(parser)
    cli.add_pods(parser)
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["round_robin", "cache_aware", "gateway:config/recommended.yaml"],
        help="round_robin, cache_aware, vllm-router:POLICY, gateway:CONFIG.yaml "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="scale the workload's offsets and (if supported) the simulator's durations "
        "(default: the preset's)",
    )
    parser.add_argument(
        "--sim-args",
        default=None,
        help="extra flags for every `heimdall-proxy sim` (default: the preset's); flags the "
        "simulator does not support are dropped with a warning",
    )
    parser.add_argument(
        "--kv-events",
        choices=("auto", "on", "off"),
        default="auto",
        help="give each pod a --kv-events-port and the gateway its kvEvents (auto: for gateway "
        "targets, when the simulator supports it)",
    )
    parser.add_argument("--router-args", default="", help="extra flags for vllm-router")
    cli.add_gateway_args(parser)
    parser.add_argument("--poll-interval", type=float, default=0.25)
    parser.add_argument("--timeout", type=float, default=3600.0, help="per request, seconds")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/out/<workload>")
    parser.add_argument("--plots-dir", type=Path, default=BENCH_DIR / "plots")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the section into FILE, replacing the workload's marked section "
        "(bench/RESULTS.md is a digest: copy figures there by hand)",
    )
    parser.add_argument("--note", action="append", default=[], help="a line for RESULTS.md")
    cli.add_progress(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        targets = [parse_target(t) for t in args.targets]
        base = workload_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    preset = PRESETS[args.workload]
    scale = preset.time_scale if args.time_scale is None else args.time_scale
    workload = base.scaled(scale)
    needs_router = any(t.kind == "vllm-router" for t in targets)
    if needs_router and importlib.util.find_spec("vllm_router") is None:
        parser.error("vllm-router is not installed: pip install -e '.[bench]'")

    supported = sim_flags()
    requested = list(preset.sim_args) if args.sim_args is None else shlex.split(args.sim_args)
    sim_args, dropped = split_sim_args(requested, supported)
    if "--time-scale" not in supported and scale != 1:
        dropped = ["--time-scale", f"{scale:g}", *dropped]
    for flag in dropped:
        if flag.startswith("--"):
            print(f"warning: `heimdall-proxy sim` has no {flag}; not passed", file=sys.stderr)
    spec = FleetSpec(args.pods, args.model, sim_args, scale, args.seed, args.kv_events, supported)
    out_dir = args.out_dir or BENCH_DIR / "out" / workload.name
    out_dir.mkdir(parents=True, exist_ok=True)
    print(workload.describe(), file=sys.stderr)

    load_before = os.getloadavg()[0]
    runs: list[TargetRun] = []
    for i, target in enumerate(targets):
        if i:
            time.sleep(1.0)  # let the previous fleet's sockets and CPU settle
        print(f"== {target.label}", file=sys.stderr)
        run = run_target(
            target,
            workload,
            spec,
            out_dir,
            router_args=shlex.split(args.router_args),
            gateway_args=shlex.split(args.gateway_args),
            poll_interval=args.poll_interval,
            timeout=args.timeout,
            progress=not args.no_progress,
        )
        print(runner.format_summary(run.result.summary), file=sys.stderr)
        runs.append(run)

    plot_rel = None
    try:
        from bench.harness.plots import plot_queues

        png = plot_queues(
            [(r.target.label, r.result.to_json()) for r in runs],
            args.plots_dir / f"{workload.name}-queues.png",
            title=f"{workload.name}: per-pod queues, {args.pods} pods",
        )
        print(f"plot: {png}", file=sys.stderr)
        with contextlib.suppress(ValueError):
            results_dir = (args.results or BENCH_DIR / "RESULTS.md").resolve().parent
            plot_rel = png.resolve().relative_to(results_dir).as_posix()
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')", file=sys.stderr)

    command = shlex.join(["python", "-m", "bench.compare", *argv])
    section = render_section(
        workload,
        runs,
        command=command,
        machine=machine_info(),
        spec=spec,
        dropped=dropped,
        plot=plot_rel,
        notes=[
            f"1-minute load average before the run {load_before:.2f}, after "
            f"{os.getloadavg()[0]:.2f} (on {os.cpu_count()} CPUs, shared with other work).",
            *auto_notes(runs, spec),
            *args.note,
        ],
    )
    print(section)
    if args.results is not None:
        write_section(args.results, workload.name, section)
        print(f"wrote the {workload.name} section of {args.results}", file=sys.stderr)
    return 0 if all(r.result.summary["errors"] == 0 for r in runs) else 2


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
