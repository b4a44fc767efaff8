"""The benchmarks' statistics: one percentile (numpy's default, linear interpolation), the
distribution summary every table reports, and the pooled-over-seeds figures with their
cluster bootstrap interval.

Pooling (the replicas criterion over many seeds at once, issue 17 item 3): pooled E2E p95
and prefix hit rate, with a cluster bootstrap interval for each variant's ratio to the
baseline.

Why pool: one run's E2E p95 on 240 requests is its 12th-worst latency, and on the saturated
multi-turn shape that moves by up to 10% between two runs of the same single replica. The
criterion is about the workload, not one draw of it, so every request of every seed goes
into one distribution per variant, and the hit rate is the fleet's hits over its queries
summed over the seeds (a seed weighs by its tokens, not as a mean of rates).

Why resample seeds and not requests: the requests of one run are not independent (a few
requests piling up on one pod slow the ones behind them, and a run's whole trajectory can
turn on one early decision), so the unit that repeats independently is the seed's run. Each
resample draws the seeds with replacement and pools the same drawn seeds for every variant
(the ratios are paired, as the runs were: same seed, same fleet, back to back).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: Resamples and RNG seed of the bootstrap: fixed, so the same JSON prints the same interval.
RESAMPLES = 2000
RNG_SEED = 20261125

#: The percentiles every distribution reports.
PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default), or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * min(max(p, 0.0), 100.0) / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def distribution(values: Sequence[float], scale: float = 1.0) -> dict[str, Any]:
    """count, mean, the PERCENTILES (p50, p95, p99) and max of `values`, each times `scale`
    (1e3: seconds to ms); None for each but the count when there are no values."""
    out: dict[str, Any] = {"count": len(values)}
    if scale != 1.0:
        values = [v * scale for v in values]
    out["mean"] = sum(values) / len(values) if values else None
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(values, p)
    out["max"] = max(values) if values else None
    return out


def pooled_p95(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The E2E p95 of every request of `rows` (one variant's rows over seeds) together."""
    values = [v for row in rows for v in row["e2e_values"]]
    return percentile(values, 95)


def pooled_hit_rate(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """Prefix hits over prefix queries, both summed over `rows`."""
    queries = sum(row["prefix_queries"] for row in rows)
    return sum(row["prefix_hits"] for row in rows) / queries if queries else None


def cluster_interval(
    clusters: Sequence[T],
    stat: Callable[[Sequence[T]], float | None],
    resamples: int = RESAMPLES,
    seed: int = RNG_SEED,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """The percentile bootstrap interval of `stat` over `clusters` drawn with replacement
    (as many as there are) `resamples` times. None if no resample gave a value."""
    n = len(clusters)
    if n < 2:  # one seed always draws itself back: an interval of no width would mislead
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        v = stat([clusters[rng.randrange(n)] for _ in range(n)])
        if v is not None:
            values.append(v)
    if not values:
        return None
    tail = (1.0 - level) / 2 * 100
    lo, hi = percentile(values, tail), percentile(values, 100 - tail)
    assert lo is not None
    assert hi is not None
    return lo, hi


@dataclass(frozen=True, slots=True)
class Pooled:
    """One variant of one shape over the seeds that carry per-request data."""

    shape: str
    label: str
    seeds: int
    p95: float | None
    hit_rate: float | None
    #: requests that failed: not in the p95, which they would otherwise flatter
    failed: int
    #: over the first variant's pooled figure, and the bootstrap interval of that ratio
    p95_ratio: float | None
    p95_interval: tuple[float, float] | None
    hit_ratio: float | None
    hit_interval: tuple[float, float] | None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _paired(
    stat: Callable[[Sequence[Mapping[str, Any]]], float | None],
    label: str,
    base: str,
    clusters: Sequence[Mapping[str, Mapping[str, Any]]],
) -> float | None:
    """`stat` of `label`'s rows over `stat` of `base`'s rows, both of the same seeds."""
    return _ratio(stat([c[label] for c in clusters]), stat([c[base] for c in clusters]))


def pool(results: Sequence[Mapping[str, Any]], resamples: int = RESAMPLES) -> list[Pooled]:
    """Per shape and variant, pooled over the seeds, with ratios to the first variant. Only
    rows with `e2e_values` count (older runs' rows, without it, are left out), and a variant
    is shown when every seed kept by the first variant has it."""
    by_shape: dict[str, list[Mapping[str, Any]]] = {}
    for result in results:
        rows = [row for row in result["rows"] if "e2e_values" in row]
        if rows:
            by_shape.setdefault(result["shape"], []).append({**result, "rows": rows})
    out: list[Pooled] = []
    for shape, runs in by_shape.items():
        base = runs[0]["rows"][0]["label"]
        labels = [row["label"] for row in runs[0]["rows"]]
        # one cluster per seed: {label: row}; seeds missing a variant are left out
        clusters = [{row["label"]: row for row in run["rows"]} for run in runs]
        clusters = [c for c in clusters if all(lb in c for lb in labels)]
        if not clusters:
            continue
        for label in labels:
            p95_ratio = functools.partial(_paired, pooled_p95, label, base)
            hit_ratio = functools.partial(_paired, pooled_hit_rate, label, base)
            mine = [c[label] for c in clusters]
            out.append(
                Pooled(
                    shape,
                    label,
                    len(clusters),
                    pooled_p95(mine),
                    pooled_hit_rate(mine),
                    sum(int(row.get("failed", 0)) for row in mine),
                    p95_ratio(clusters),
                    cluster_interval(clusters, p95_ratio, resamples),
                    hit_ratio(clusters),
                    cluster_interval(clusters, hit_ratio, resamples),
                )
            )
    return out


def _x(v: float | None, ci: tuple[float, float] | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def table(pooled: Sequence[Pooled]) -> list[str]:
    """Markdown lines: each variant's pooled figures and its ratios with 95% intervals."""
    lines = [
        "#### Pooled over the seeds: every request's E2E, hits over queries; ratio to the "
        f"first variant [95% interval, {RESAMPLES} resamples of the seeds]",
        "",
        "| shape | variant | seeds | pooled E2E p95 (s) | p95 / first | pooled hit rate "
        "| hit rate / first | failed |",
        "|---|---|---:|---:|---|---:|---|---:|",
    ]
    for p in pooled:
        p95 = "-" if p.p95 is None else f"{p.p95:.3f}"
        hit = "-" if p.hit_rate is None else f"{p.hit_rate:.2%}"
        lines.append(
            f"| {p.shape} | {p.label} | {p.seeds} | {p95} | {_x(p.p95_ratio, p.p95_interval)} "
            f"| {hit} | {_x(p.hit_ratio, p.hit_interval)} | {p.failed} |"
        )
    return lines
