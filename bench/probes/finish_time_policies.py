"""finish-time-scorer's estimate as the whole dispatcher, in the oracle's simulated pods, with
exact inputs: how far is the slot replay from the oracle's greedy rule, and which part of the
pods' behaviour does it miss? (bench/RESULTS.md, "Finish time")

Each policy sends every request on arrival to the pod with the least value of its estimate,
computed from the pod's true state: its running and waiting requests (prompt left, output
left), its slots, its cache (the prompt blocks it holds), its adapter slots, and its true time
per output token with its slots full (`step_base + decode_cost_per_seq * slots`, so a slow
pod's own). The estimate is framework/finish_time.py's `finish_time`, as the scorer computes
it, plus what a variant adds:

- `ft`:      the scorer's estimate;
- `+load`:   the request's own adapter load time when its adapter is not resident;
- `+pf`:     the prefills still to run on the pod, which share its steps with the request;
- `rr`:      round-robin, for scale.

The oracle itself steps a copy of each pod forward (bench/harness/oracle.py). Ratios are to
its E2E mean and p95, per seed, and their geometric mean over the seeds.

Run: python -m bench.probes.finish_time_policies [--shapes mixed,unequal] [--seeds 42,7,1,2,3,4]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

from bench import matrix
from bench.harness import oracle
from bench.harness.stats import percentile
from heimdall_proxy.framework.finish_time import Ahead, finish_time

Estimate = Callable[[oracle.Pod, oracle.OracleRequest], float]


def _cached(pod: oracle.Pod, req: oracle.OracleRequest) -> int:
    """Prompt tokens `pod` holds of `req` (the oracle's lookup, without touching the LRU)."""
    n = 0
    for key in req.blocks[: (req.prompt - 1) // pod.o.block_size]:
        if key not in pod.lru:
            break
        n += 1
    return n * pod.o.block_size


def estimate(load: bool, prefills: bool) -> Estimate:
    def seconds(pod: oracle.Pod, req: oracle.OracleRequest) -> float:
        o = pod.o
        tpot = o.step_base + o.decode_cost_per_seq * pod.slots
        spt = o.prefill_cost_per_token
        ahead = [
            Ahead(
                max(0, s.req.prompt - s.computed) * spt + (s.req.output - s.produced) * tpot,
                s.req.lora or "",
            )
            for s in pod.running
        ]
        ahead += [
            Ahead(s.req.prompt * spt + s.req.output * tpot, s.req.lora or "") for s in pod.waiting
        ]
        own = (req.prompt - _cached(pod, req)) * spt + req.output * tpot
        if load and req.lora and req.lora not in pod.loras.resident:
            own += o.lora_load_time
        if prefills:
            own += sum(max(0, s.req.prompt - s.computed) for s in pod.running) * spt
            own += sum(s.req.prompt - _cached(pod, s.req) for s in pod.waiting) * spt
        return finish_time(ahead, own, pod.slots, req.lora or "", o.max_loras)

    return seconds


POLICIES: dict[str, Estimate | None] = {
    "rr": None,
    "ft": estimate(load=False, prefills=False),
    "ft+load": estimate(load=True, prefills=False),
    "ft+pf": estimate(load=False, prefills=True),
    "ft+load+pf": estimate(load=True, prefills=True),
}


def dispatch(
    reqs: Sequence[oracle.OracleRequest], options: Sequence[object], policy: str
) -> tuple[float, float, float]:
    """(E2E mean, E2E p95, prefix hit rate) of `policy` over pods with these options."""
    fleet = [oracle.Pod(o) for o in options]  # type: ignore[arg-type]
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
    seqs: list[oracle._Seq] = []
    rule = POLICIES[policy]
    for n, i in enumerate(order):
        req = reqs[i]
        for pod in fleet:
            pod.advance(req.arrival)
        seq = oracle._Seq(i, req)
        if rule is None:
            best = n % len(fleet)
        else:
            values = [rule(pod, req) for pod in fleet]
            best = min(range(len(fleet)), key=lambda k: (values[k], k))
        fleet[best].submit(seq, req.arrival)
        seqs.append(seq)
    for pod in fleet:
        pod.advance(math.inf)
    e2e = [s.finish - s.req.arrival for s in seqs]
    hits = sum(max(0, s.hits) for s in seqs) / max(1, sum(s.req.prompt for s in seqs))
    return sum(e2e) / len(e2e), percentile(e2e, 95) or 0.0, hits


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="mixed,unequal")
    parser.add_argument("--seeds", default="42,7,1,2,3,4")
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = args.policies.split(",")
    print("E2E mean / oracle, p95 / oracle: geometric mean over seeds " + args.seeds)
    print("| shape | " + " | ".join(policies) + " |")
    print("|---|" + "---|" * len(policies))
    for name in args.shapes.split(","):
        shape = matrix.SHAPES[name]
        logs: dict[str, list[tuple[float, float]]] = {p: [] for p in policies}
        for seed in seeds:
            reqs = oracle.requests_of(matrix.build_workload(shape, True, seed))
            options = matrix.pod_options(shape, 4)
            best = oracle.simulate(reqs, options)
            for p in policies:
                mean, p95, _ = dispatch(reqs, options, p)
                logs[p].append((math.log(mean / best.mean()), math.log(p95 / best.p95())))
        cells = []
        for p in policies:
            xs = logs[p]
            m = math.exp(sum(x for x, _ in xs) / len(xs))
            q = math.exp(sum(y for _, y in xs) / len(xs))
            cells.append(f"{m:.2f}x, {q:.2f}x")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
