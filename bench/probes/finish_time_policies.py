"""finish-time-scorer's estimate as the whole dispatcher, in the oracle's simulated pods: how
far from the oracle's greedy rule is the engine model (framework/engine_model.py) given what
the gateway sees, and which part of what it sees matters? (bench/RESULTS.md, "Finish time:
the engine's steps")

The oracle steps a copy of each pod forward from its true state (bench/harness/oracle.py).
Each policy here sends every request on arrival to the pod with the least value of the
scorer's estimate, `finish_seconds`, computed from the pod as the gateway sees it: as of the
pod's last step that ended before the arrival (a stream's newest chunk), with the requests
that have streamed a token decoding and the others waiting with the prompt the pod did not
hold when they were sent, the request joining once it is sent; the adapters of the requests
that last began to run there taken as resident. The pods are stepped one step at a time to
keep that view. Variants take away one input:

- `ft`:        the scorer's estimate, with each pod's true step costs;
- `ft-fleet`:  every pod priced at the first pod's costs (no learned speed);
- `ft-slots?`: the pod's slots unknown (every request sent runs at once);
- `ft-lora?`:  no adapter taken as resident (each adapter request pays a load);
- `ft-now`:    the request joins at the view's step boundary (the time since the last step
               seen not counted);
- `rr`:        round-robin, for scale.

Ratios are to the oracle's E2E mean and p95, per seed, and their geometric mean over seeds.

Run: python -m bench.probes.finish_time_policies [--shapes mixed,unequal] [--seeds 42,7,1]
"""

from __future__ import annotations

import argparse
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench import matrix
from bench.harness import oracle
from bench.harness.stats import percentile
from heimdall_proxy.framework.engine_model import Job, StepCosts, finish_seconds
from heimdall_proxy.sim.options import SimOptions


class SeenPod(oracle.Pod):
    """An oracle pod stepped one step at a time, keeping itself as of the last step that
    ended at or before the time it was advanced to: what the gateway has seen of it."""

    seen: oracle.Pod | None = None

    def advance(self, until: float) -> None:
        self.seen = None
        while self.busy and self.clock < until:
            before = _view(self)
            self._step()
            if self.clock > until:
                self.seen = before
        if not self.busy:
            self.clock = max(self.clock, until)

    def view(self) -> oracle.Pod:
        return self if self.seen is None else self.seen


def _view(pod: oracle.Pod) -> oracle.Pod:
    """A copy of `pod`'s queue and clock (its cache shared: read, never stepped)."""
    p = oracle.Pod(pod.o, pod.slots)
    p.clock = pod.clock
    p.running = [s.copy() for s in pod.running]
    p.waiting = deque(s.copy() for s in pod.waiting)
    p.lru = pod.lru
    return p


def costs_of(o: SimOptions) -> StepCosts:
    return StepCosts(
        step=o.step_base,
        per_seq=o.decode_cost_per_seq,
        per_prefill_token=o.prefill_cost_per_token,
        per_context_token=o.kv_read_cost_per_token,
        budget=o.max_num_batched_tokens,
        lora_load=o.lora_load_time,
    )


def _cached(pod: oracle.Pod, req: oracle.OracleRequest) -> int:
    """Prompt tokens `pod` holds of `req` (the oracle's lookup, without touching the LRU)."""
    n = 0
    for key in req.blocks[: (req.prompt - 1) // pod.o.block_size]:
        if key not in pod.lru:
            break
        n += 1
    return n * pod.o.block_size


@dataclass(frozen=True)
class Variant:
    fleet_costs: bool = False
    slots: bool = True
    lora: bool = True
    since: bool = True


Estimate = Callable[[oracle.Pod, oracle.OracleRequest, StepCosts, Sequence[str], float], float]


def estimate(v: Variant) -> Estimate:
    def seconds(
        pod: oracle.Pod,
        req: oracle.OracleRequest,
        costs: StepCosts,
        resident: Sequence[str],
        now: float,
    ) -> float:
        running, waiting = [], []
        for s in sorted([*pod.running, *pod.waiting], key=lambda s: s.rid):
            lora = s.req.lora or ""
            if s.produced:
                running.append(Job(0, s.computed, s.req.output - s.produced, lora))
            else:
                cached = s.hits if s.hits >= 0 else _cached(pod, s.req)
                waiting.append(Job(s.req.prompt - cached, cached, s.req.output, lora))
        cached = _cached(pod, req)
        own = Job(req.prompt - cached, cached, req.output, req.lora or "")
        since = max(0.0, now - pod.clock) if v.since and pod.busy else 0.0
        return finish_seconds(
            running,
            waiting,
            own,
            costs,
            pod.slots if v.slots else None,
            pod.o.max_loras,
            resident if v.lora else (),
            own_at=since,
        )

    return seconds


POLICIES: dict[str, Variant | None] = {
    "rr": None,
    "ft": Variant(),
    "ft-fleet": Variant(fleet_costs=True),
    "ft-slots?": Variant(slots=False),
    "ft-lora?": Variant(lora=False),
    "ft-now": Variant(since=False),
}


def dispatch(
    reqs: Sequence[oracle.OracleRequest], options: Sequence[SimOptions], policy: str
) -> tuple[float, float]:
    """(E2E mean, E2E p95) of `policy` over pods with these options."""
    fleet = [SeenPod(o) for o in options]
    variant = POLICIES[policy]
    rule = None if variant is None else estimate(variant)
    costs = [costs_of(options[0] if variant and variant.fleet_costs else o) for o in options]
    # per pod: the adapters of the requests that last began to run there
    ran: list[OrderedDict[str, None]] = [OrderedDict() for _ in fleet]
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
    seqs: list[oracle._Seq] = []
    for n, i in enumerate(order):
        req = reqs[i]
        for k, pod in enumerate(fleet):
            pod.advance(req.arrival)
            for s in pod.view().running:
                if s.req.lora and s.produced:
                    ran[k].pop(s.req.lora, None)
                    ran[k][s.req.lora] = None
        seq = oracle._Seq(i, req)
        if rule is None:
            best = n % len(fleet)
        else:
            values = [
                rule(pod.view(), req, costs[k], list(ran[k]), req.arrival)
                for k, pod in enumerate(fleet)
            ]
            best = min(range(len(fleet)), key=lambda k: (values[k], k))
        fleet[best].submit(seq, req.arrival)
        seqs.append(seq)
    for pod in fleet:
        pod.advance(math.inf)
    e2e = [s.finish - s.req.arrival for s in seqs]
    return sum(e2e) / len(e2e), percentile(e2e, 95) or 0.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="mixed,unequal")
    parser.add_argument("--seeds", default="42,7,1")
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
                mean, p95 = dispatch(reqs, options, p)
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
