"""Failures and overload, measured: what a client sees when a pod fails, dies, or the fleet is
offered more than it can serve (issue 14's bench).

Scenarios, each on a fresh fleet of simulated pods (real processes, `--fault-control` so the
bench can flip a pod's failure knobs over HTTP), against every target on the same schedule:

- `503`: three pods; one answers 503 to every inference request for the middle half of the
  run. Reported: requests that failed (target 0) and the extra attempts the router spent.
- `kill`: three pods; one is SIGKILLed at 30% of the run and restarted on the same port at
  50%. Reported: failed requests (a request whose pod died before its first byte could have
  gone elsewhere) and the seconds from the restart until the pod served again.
- `overload`: two pods with two slots each, offered 1.5x what they can serve, half of the
  requests sheddable (`x-gateway-inference-objective: batch`, priority -1). Reported:
  goodput, the p99 latency of the served non-sheddable requests, and the share shed.

    python -m bench.faults                               # every scenario, default targets
    python -m bench.faults --scenarios overload --targets round_robin config/flow-control.yaml
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.harness import cli, machine, runner, stats
from bench.harness.gateway import gateway_config
from bench.harness.pods import FleetSpec, Pod, sim_command, sim_flags
from bench.harness.procs import HOST, Proc, free_port, http_get, wait_until
from bench.harness.targets import Target, parse_target, router_command, router_ready
from bench.harness.workloads import TimedRequest, words_text

OUT = machine.BENCH_DIR / "out" / "faults"
DEFAULT_TARGETS = ("round_robin", "cache_aware", "config/recommended.yaml")
MODEL = "sim-model"
SHEDDABLE = {"x-gateway-inference-objective": "batch"}


@dataclass(frozen=True)
class Scenario:
    key: str
    pods: int
    rate: float  # requests per second
    duration: float  # seconds of sending
    max_tokens: int
    sim_args: tuple[str, ...] = ()
    sheddable_share: float = 0.0


SCENARIOS = {
    s.key: s
    for s in (
        Scenario("503", pods=3, rate=12.0, duration=20.0, max_tokens=24),
        Scenario("kill", pods=3, rate=12.0, duration=20.0, max_tokens=24),
        # two pods x two slots; a request takes ~0.5 s alone: ~8/s capacity, offered 12/s
        Scenario("overload", pods=2, rate=12.0, duration=20.0, max_tokens=60,
                 sim_args=("--max-num-seqs", "2"), sheddable_share=0.5),
    )
}  # fmt: skip


def schedule(s: Scenario, seed: int = 7) -> list[TimedRequest]:
    rng = random.Random(seed)
    out = []
    n = int(s.rate * s.duration)
    for i in range(n):
        shed = rng.random() < s.sheddable_share
        body = {
            "model": MODEL,
            "prompt": words_text(rng, rng.randint(40, 120)),
            "max_tokens": s.max_tokens,
        }
        out.append(
            TimedRequest(
                f"r{i}",
                i / s.rate,
                "/v1/completions",
                body,
                "sheddable" if shed else "critical",
                dict(SHEDDABLE) if shed else {},
            )
        )
    return out


def post_json(url: str, doc: dict[str, Any]) -> None:
    import urllib.request

    req = urllib.request.Request(
        url, json.dumps(doc).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=2.0) as resp:
        resp.read()


# ---- one run ------------------------------------------------------------------------------


@dataclass
class Run:
    target: str
    results: list[runner.RequestResult]
    retries: float | None = None
    events: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0


@contextlib.contextmanager
def pods_up(spec: FleetSpec, logs: Path, slug: str) -> Iterator[list[Proc]]:
    pods = [Pod(f"pod-{i}", free_port()) for i in range(spec.pods)]
    procs = [
        Proc(p.name, sim_command(spec, p, i), logs / f"{slug}-{p.name}.log")
        for i, p in enumerate(pods)
    ]
    try:
        for proc in procs:
            proc.start()
        for pod, proc in zip(pods, procs, strict=True):
            wait_until(proc, lambda u=pod.url: http_get(u + "/health")[0] == 200, "pod health")
        for proc, pod in zip(procs, pods, strict=True):
            proc.pod = pod  # type: ignore[attr-defined]
        yield procs
    finally:
        for proc in procs:
            proc.stop()


async def drive(url: str, requests: Sequence[TimedRequest]) -> list[runner.RequestResult]:
    results = [runner.RequestResult(r.id, r.tag, r.path, r.offset) for r in requests]
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(req: TimedRequest, res: runner.RequestResult) -> None:
            await asyncio.sleep(max(0.0, req.offset - (time.perf_counter() - t0)))
            res.sent = time.perf_counter() - t0
            await runner.send_one(session, url, req, res, 120.0)

        await asyncio.gather(*(one(r, res) for r, res in zip(requests, results, strict=True)))
    return results


def run_one(scn: Scenario, target: Target, out: Path) -> Run:
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    spec = FleetSpec(
        scn.pods, MODEL, [*scn.sim_args, "--fault-control"], 1.0, 42, "off", sim_flags()
    )
    requests = schedule(scn)
    with pods_up(spec, logs, f"{scn.key}-{target.slug}") as procs:
        pods = [p.pod for p in procs]  # type: ignore[attr-defined]
        config_path = None
        if target.kind == "gateway":
            doc = yaml.safe_load(Path(target.arg).read_text()) or {}
            config_path = out / f"{scn.key}-{target.slug}.config.yaml"
            config_path.write_text(yaml.safe_dump(gateway_config(doc, pods)))
        port = free_port()
        argv = router_command(target, pods, port, config_path, [])
        router = Proc(target.slug, argv, logs / f"{scn.key}-{target.slug}-router.log")
        router.start()
        url = f"http://{HOST}:{port}"
        try:
            wait_until(
                router,
                lambda: router_ready(target, url, len(pods), MODEL),
                "the router to see every pod",
            )
            run = Run(target.label, [])
            t0 = time.perf_counter()
            run.results = asyncio.run(inject_during(scn, procs, url, requests, run, t0))
            run.wall = time.perf_counter() - t0
            if target.kind == "gateway":
                _, text = http_get(url + "/metrics")
                metrics = runner.parse_metrics(text)
                run.retries = sum(
                    v for k, v in metrics.items() if k.startswith("inference_objective_retries")
                )
        finally:
            router.stop()
    return run


async def inject_during(
    scn: Scenario,
    procs: list[Proc],
    url: str,
    requests: Sequence[TimedRequest],
    run: Run,
    t0: float,
) -> list[runner.RequestResult]:
    async def at(fraction: float) -> None:
        await asyncio.sleep(max(0.0, fraction * scn.duration - (time.perf_counter() - t0)))

    async def faults() -> None:
        victim = procs[0]
        pod = victim.pod  # type: ignore[attr-defined]
        if scn.key == "503":
            await at(0.25)
            await asyncio.to_thread(post_json, pod.url + "/sim/fault", {"fail_status": 503})
            run.events["fail_from"] = time.perf_counter() - t0
            await at(0.75)
            await asyncio.to_thread(post_json, pod.url + "/sim/fault", {"fail_status": None})
            run.events["fail_until"] = time.perf_counter() - t0
        elif scn.key == "kill":
            await at(0.30)
            assert victim.popen is not None
            victim.popen.kill()
            victim.popen.wait()
            run.events["killed"] = time.perf_counter() - t0
            await at(0.50)
            victim.start()
            run.events["restarted"] = time.perf_counter() - t0

    results, _ = await asyncio.gather(drive(url, requests), faults())
    return results


# ---- the report ---------------------------------------------------------------------------


def summarize(scn: Scenario, run: Run) -> dict[str, Any]:
    res = run.results
    failed = [r for r in res if not r.ok]
    doc: dict[str, Any] = {
        "requests": len(res),
        "failed": len(failed),
        "failures": sorted({runner.error_kind(r.error or "") for r in failed}),
        "extra_attempts": run.retries,
        "wall": run.wall,
        "events": run.events,
    }
    if scn.key == "kill" and "restarted" in run.events:
        back = [
            r.sent for r in res if r.ok and r.pod == "pod-0" and r.sent >= run.events["restarted"]
        ]
        doc["back_after"] = min(back) - run.events["restarted"] if back else None
        lost = [r for r in failed if run.events["killed"] <= r.sent]
        doc["failed_after_kill"] = len(lost)
    if scn.key == "overload":
        crit = [r for r in res if r.tag == "critical"]
        shed = [r for r in res if r.tag == "sheddable"]
        served = [r for r in crit if r.ok and r.e2e is not None]
        doc["goodput"] = sum(1 for r in res if r.ok) / run.wall
        doc["critical_served"] = f"{len(served)}/{len(crit)}"
        doc["critical_p99"] = stats.percentile([r.e2e for r in served if r.e2e], 99)
        doc["critical_p50"] = stats.percentile([r.e2e for r in served if r.e2e], 50)
        doc["shed_share"] = sum(1 for r in shed if r.status == 429) / max(1, len(shed))
        doc["critical_failed"] = sum(1 for r in crit if not r.ok)
    return doc


def table(scn: Scenario, rows: dict[str, dict[str, Any]]) -> list[str]:
    def f(v: Any, d: int = 2) -> str:
        return "-" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))

    if scn.key == "overload":
        head = (
            "| target | goodput (req/s) | critical served | critical p50 / p99 (s) "
            "| critical failed | sheddable shed |"
        )
        lines = [head, "|---|---:|---:|---:|---:|---:|"]
        for t, d in rows.items():
            lines.append(
                f"| {t} | {f(d['goodput'], 1)} | {d['critical_served']} | "
                f"{f(d['critical_p50'])} / {f(d['critical_p99'])} | {d['critical_failed']} | "
                f"{100 * d['shed_share']:.0f}% |"
            )
        return lines
    extra = "pod serves again after restart (s)" if scn.key == "kill" else "extra attempts"
    lines = [
        f"| target | requests | failed | failure kinds | {extra} |",
        "|---|---:|---:|---|---:|",
    ]
    for t, d in rows.items():
        val = d.get("back_after") if scn.key == "kill" else d.get("extra_attempts")
        kinds = ", ".join(d["failures"]) or "-"
        lines.append(f"| {t} | {d['requests']} | {d['failed']} | {kinds} | {f(val, 1)} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--targets", nargs="+", default=list(DEFAULT_TARGETS))
    cli.add_output(ap, markdown=False)
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine.machine_info(),
        "command": "python -m bench.faults " + " ".join(sys.argv[1:]),
        "scenarios": {},
    }
    for key in args.scenarios.split(","):
        scn = SCENARIOS[key]
        rows: dict[str, dict[str, Any]] = {}
        for spec in args.targets:
            target = parse_target(spec)
            print(f"== {key}: {target.label}", file=sys.stderr)
            rows[target.label] = summarize(scn, run_one(scn, target, OUT))
            print(json.dumps(rows[target.label]), file=sys.stderr)
        report["scenarios"][key] = rows
        print(f"\n### {key}\n")
        print("\n".join(table(scn, rows)))
    cli.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
