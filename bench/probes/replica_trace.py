"""Decision by decision: what a replica of a shared pair saw against the fleet's true state.

Reads the gateways' logs of a `bench/replicas.py --trace` run (prefix-cache-affinity-filter's
trace lines, heimdall_proxy/plugins/prefix_affinity/trace.py). For every decision of the
filter (keep the prefix's pods, or release), on one host whose wall clocks agree:

- **in-flight lag**: the prompt tokens in flight per pod as the deciding replica saw them
  (its own + the others' last pulled) against the true total at that instant, rebuilt from
  every replica's start and end lines. Missing starts (the other replica's newest requests)
  show as an undercount, missing ends as an overcount;
- **queue price**: the seconds per token the replica learned from its own first tokens,
  against a price learned from every replica's first tokens (the same QueueDelay, replayed);
- **flips**: how many keep/release outcomes would change with the true in-flight tokens, with
  the fleet-wide price, or with both (the estimate's own-prefill term is kept as logged).

    python -m bench.probes.replica_trace /tmp/out/replicas.json
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import cli
from heimdall_proxy.framework.queue_delay import QueueDelay

#: The filter's default when nothing is learned yet (1 / peakPrefillThroughput).
DEFAULT_PRICE = 1.0 / 16000.0


def events(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Every trace record in the logs, by time."""
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                at = line.find("affinity {")
                if at < 0:
                    continue
                text = line[at + len("affinity ") :].strip()
                end = text.rfind("}")
                out.append(json.loads(text[: end + 1]))
    out.sort(key=lambda e: e["t"])
    return out


@dataclass
class Interval:
    pod: str
    tokens: float
    start: float
    end: float = float("inf")


@dataclass
class Stats:
    decisions: int = 0
    released: int = 0
    lagged: int = 0  # decisions whose seen in-flight differed from the truth on some pod
    under: float = 0.0  # tokens missing from the view (others' starts not yet seen)
    over: float = 0.0  # tokens still in the view (others' ends not yet seen)
    flips_true_inflight: int = 0
    flips_fleet_price: int = 0
    flips_both: int = 0
    #: decisions whose request went to a pod the view undercounted (another replica's start
    #: there not yet seen: both may have picked the same pod)
    picked_undercounted: int = 0
    price_ratio: list[float] = field(default_factory=list)  # own price / fleet price, sticky pods

    def row(self) -> dict[str, Any]:
        n = max(1, self.decisions)
        ratios = sorted(self.price_ratio)

        def q(p: float) -> float | None:
            return ratios[min(len(ratios) - 1, int(p * len(ratios)))] if ratios else None

        return {
            "decisions": self.decisions,
            "released": self.released,
            "lagged": self.lagged,
            "lagged_share": self.lagged / n,
            "under_tokens_per_decision": self.under / n,
            "over_tokens_per_decision": self.over / n,
            "flips_true_inflight": self.flips_true_inflight,
            "flips_fleet_price": self.flips_fleet_price,
            "flips_both": self.flips_both,
            "picked_undercounted": self.picked_undercounted,
            "price_ratio_p10_p50_p90": [q(0.1), q(0.5), q(0.9)],
        }


def _outcome(est: Mapping[str, float], sticky: set[str], margin: float) -> bool:
    best_sticky = min(v for p, v in est.items() if p in sticky)
    best_other = min(v for p, v in est.items() if p not in sticky)
    return best_sticky > best_other + margin


def analyse(evs: Sequence[Mapping[str, Any]]) -> Stats:
    intervals: dict[str, Interval] = {}
    for e in evs:
        if e["ev"] == "start":
            intervals[e["id"]] = Interval(e["pod"], float(e["tokens"]), e["t"])
        elif e["ev"] == "end" and e["id"] in intervals:
            intervals[e["id"]].end = e["t"]
    picked = {key.split(":")[0]: span.pod for key, span in intervals.items()}
    spans = sorted(intervals.values(), key=lambda i: i.start)
    starts = [i.start for i in spans]
    fleet = QueueDelay()
    stats = Stats()
    for e in evs:
        if e["ev"] == "first":
            fleet.observe(e["pod"], e["ahead"], e["delay"])
            continue
        if e["ev"] != "filter":
            continue
        t = e["t"]
        true: dict[str, float] = {}
        for span in spans[: bisect.bisect_right(starts, t)]:
            if span.end > t:
                true[span.pod] = true.get(span.pod, 0.0) + span.tokens
        view: dict[str, list[float]] = e["view"]
        sticky = set(e["sticky"])
        stats.decisions += 1
        stats.released += bool(e["released"])
        lagged = False
        est_true, est_price, est_both = {}, {}, {}
        for pod, (local, others, price, est) in view.items():
            seen = local + others
            diff = seen - true.get(pod, 0.0)
            if abs(diff) > 0.5:
                lagged = True
                if diff < 0:
                    stats.under -= diff
                else:
                    stats.over += diff
            fp = fleet.seconds_per_token(pod, DEFAULT_PRICE)
            own = est - seen * price
            est_true[pod] = own + true.get(pod, 0.0) * price
            est_price[pod] = own + seen * fp
            est_both[pod] = own + true.get(pod, 0.0) * fp
            if pod in sticky and fp > 0:
                stats.price_ratio.append(price / fp)
        stats.lagged += lagged
        pod = picked.get(e["id"])
        if pod in view and sum(view[pod][:2]) < true.get(pod, 0.0) - 0.5:
            stats.picked_undercounted += 1
        released = bool(e["released"])
        margin = float(e["margin"])
        stats.flips_true_inflight += _outcome(est_true, sticky, margin) != released
        stats.flips_fleet_price += _outcome(est_price, sticky, margin) != released
        stats.flips_both += _outcome(est_both, sticky, margin) != released
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("json", type=Path, nargs="+", help="bench/replicas.py --json outputs")
    args = parser.parse_args(argv)
    print(
        "| shape | seed | variant | decisions | released | view lagged | tokens missing / "
        "decision | tokens stale / decision | flips: true in-flight | flips: fleet price "
        "| flips: both | picked an undercounted pod | own / fleet price p10 p50 p90 |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for path in args.json:
        for result in json.loads(path.read_text()):
            for row in result["rows"]:
                if not row.get("logs"):
                    continue
                s = analyse(events(row["logs"])).row()
                ratios = " ".join("-" if r is None else f"{r:.2f}" for r in
                                  s["price_ratio_p10_p50_p90"])  # fmt: skip
                print(
                    f"| {result['shape']} | {result.get('seed', 42)} | {row['label']} "
                    f"| {s['decisions']} | {s['released']} "
                    f"| {s['lagged']} ({s['lagged_share']:.0%}) "
                    f"| {s['under_tokens_per_decision']:.0f} | {s['over_tokens_per_decision']:.0f} "
                    f"| {s['flips_true_inflight']} | {s['flips_fleet_price']} | {s['flips_both']} "
                    f"| {s['picked_undercounted']} "
                    f"| {ratios} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
