"""bench/harness/stats.py: pooling over seeds and the cluster bootstrap interval of the ratios."""

from __future__ import annotations

import statistics

import pytest

from bench.harness.stats import (
    cluster_interval,
    percentile,
    pool,
    pooled_hit_rate,
    pooled_p95,
    table,
)


def row(label: str, values: list[float], hits: float, queries: float) -> dict[str, object]:
    return {"label": label, "e2e_values": values, "prefix_hits": hits, "prefix_queries": queries}


def run(seed: int, one: dict[str, object], pair: dict[str, object]) -> dict[str, object]:
    return {"shape": "multi-turn", "seed": seed, "rows": [one, pair]}


def test_pooling_takes_every_request_and_sums_hits_and_queries() -> None:
    # Seed 1 is fast and small, seed 2 slow and large: pooled is neither seed's p95 nor the
    # mean of the two, and the hit rate weighs seed 2 by its queries (not (0.5 + 0.9) / 2).
    a = row("1 replica", [float(v) for v in range(1, 21)], 10, 20)
    b = row("1 replica", [float(v) for v in range(100, 180)], 720, 800)
    values = [float(v) for v in range(1, 21)] + [float(v) for v in range(100, 180)]
    assert pooled_p95([a, b]) == percentile(values, 95)
    assert pooled_p95([a, b]) != statistics.mean([percentile(r["e2e_values"], 95) for r in (a, b)])  # type: ignore[arg-type]
    assert pooled_hit_rate([a, b]) == 730 / 820


def test_the_ratio_is_of_pooled_figures_and_one_seed_gives_no_interval() -> None:
    one = row("1 replica", [1.0] * 50 + [2.0] * 50, 8, 10)
    pair = row("pair", [1.0] * 50 + [3.0] * 50, 9, 10)
    [base, p] = pool([run(1, one, pair)], resamples=200)
    assert base.p95_ratio == 1.0
    assert p.p95_ratio == 1.5 and p.hit_ratio == 0.9 / 0.8
    # resampling seeds, not requests: one seed always draws itself back, so an interval of
    # no width would claim a precision one run does not have
    assert base.p95_interval is None and p.p95_interval is None and p.hit_interval is None


def test_seeds_are_resampled_together_for_every_variant() -> None:
    # The pair is 1.1x one replica on every seed, but the seeds' levels differ by 10x: a
    # resample that drew the variants' seeds independently would spread the ratio widely.
    runs = [
        run(s, row("1 replica", [s * 1.0] * 20, s, 10), row("pair", [s * 1.1] * 20, s, 10))
        for s in range(1, 11)
    ]
    [_, p] = pool(runs, resamples=500)
    assert p.p95_interval is not None
    assert abs(p.p95_interval[0] - 1.1) < 1e-9 and abs(p.p95_interval[1] - 1.1) < 1e-9


@pytest.mark.slow
def test_the_interval_is_the_central_95_percent_of_the_resampled_statistic() -> None:
    # The mean of 400 draws from 0..0.9975: sd of the mean 0.2887 / 20, so the 95% interval
    # is 0.49875 +- 1.96 * 0.01443 = [0.4705, 0.5270]; min/max or a 68% interval would miss.
    clusters = [i / 400 for i in range(400)]
    lo_hi = cluster_interval(clusters, statistics.mean, resamples=2000)
    assert lo_hi is not None
    assert abs(lo_hi[0] - 0.4705) < 0.006 and abs(lo_hi[1] - 0.5270) < 0.006


def test_runs_without_per_request_data_are_left_out() -> None:
    old = {"shape": "hot-prefix", "seed": 1, "rows": [{"label": "1 replica", "e2e": {}}]}
    assert pool([old]) == []
    pair = {**row("pair", [1.0], 1, 2), "failed": 3}
    runs = [run(seed, row("1 replica", [1.0], 1, 2), pair) for seed in (1, 2)]
    lines = table(pool(runs))
    assert "| multi-turn | pair | 2 | 1.000 | 1.000x [1.000, 1.000] | 50.00% " in lines[-1]
    assert lines[-1].endswith("| 6 |")  # failures summed over the seeds, shown beside the p95


def test_a_row_without_per_request_data_does_not_drop_the_seed() -> None:
    # e.g. a peer router's row summarised without samples: the variants that have them pool
    router = {"label": "vllm-router round_robin", "e2e": {}}
    runs = [
        {**run(seed, row("1 replica", [1.0], 1, 2), row("pair", [2.0], 1, 2))} for seed in (1, 2)
    ]
    for r in runs:
        r["rows"] = [*r["rows"], router]  # type: ignore[list-item]
    assert [(p.label, p.seeds, p.p95_ratio) for p in pool(runs, resamples=50)] == [
        ("1 replica", 2, 1.0),
        ("pair", 2, 2.0),
    ]
