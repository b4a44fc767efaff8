"""bench/replicas.py: the shared config it derives from a gateway config."""

from __future__ import annotations

from bench import matrix
from bench.replicas import (
    build_workload,
    pooled_lines,
    same_pod,
    same_pod_counts,
    shared_config,
    spread,
)


def test_redis_config_goes_on_the_shareable_plugins_only() -> None:
    doc = {
        "config": {
            "plugins": [
                {"type": "prefix-cache-scorer", "parameters": {"autoTune": False}},
                {"type": "outstanding-work-scorer"},
                {"type": "load-aware-scorer"},
            ]
        }
    }
    out = shared_config(doc, "redis://h:1", "k:", "50ms")
    plugins = out["config"]["plugins"]
    rc = {"address": "redis://h:1", "keyPrefix": "k:"}
    assert plugins[0]["parameters"] == {
        "autoTune": False,
        "redisConfig": rc,
        "syncInterval": "50ms",
    }
    assert plugins[1]["parameters"] == {"redisConfig": rc, "syncInterval": "50ms"}
    assert "parameters" not in plugins[2]
    assert "parameters" not in doc["config"]["plugins"][1]  # the input is left as it was


def row(label: str, p95: float, hit: float) -> dict[str, object]:
    return {"label": label, "e2e": {"p95": p95}, "prefix_hit_rate": hit}


def test_the_spread_gives_each_variants_median_and_range_over_the_seeds() -> None:
    results = [
        {
            "shape": "hot-prefix",
            "seed": seed,
            "rows": [row("1 replica", 2.0, 0.9), row("pair", p95, 0.9), row("again", 2.0, hit)],
        }
        for seed, p95, hit in ((1, 2.0, 0.9), (2, 2.2, 0.9), (3, 1.92, 0.81))
    ]
    lines = spread(results)
    assert (
        "| hot-prefix | pair | 3 | 1.000x [0.960, 1.100] | 1 | 1.000x [1.000, 1.000] | 0 |" in lines
    )
    assert (
        "| hot-prefix | again | 3 | 1.000x [1.000, 1.000] | 0 | 1.000x [0.900, 1.000] | 1 |"
        in lines
    )


def test_earlier_json_without_per_request_latencies_says_it_cannot_be_pooled() -> None:
    results = [{"shape": "hot-prefix", "seed": 1, "rows": [row("1 replica", 2.0, 0.9)]}]
    assert pooled_lines(results) == [
        "(no pooled figures: these runs' JSON has no per-request latencies)"
    ]


def test_same_pod_counts_consecutive_requests_by_the_gap_between_their_sends() -> None:
    offsets = [0.0, 0.001, 0.004, 0.020, 0.027, 0.100]
    pods = ["a", "a", "b", "b", "a", None]
    # gaps: 1 ms same, 3 ms not, 16 ms same, 7 ms not, 73 ms (no pod) not
    assert same_pod_counts(offsets, pods) == [(2, 1), (1, 0), (1, 1), (1, 0)]


def test_same_pod_redraws_the_workload_the_run_used() -> None:
    # A --quick run read back without --quick: the send offsets must be the quick workload's
    # (a longer workload's offsets would pair the pods with the wrong gaps, or overrun them).
    shape = matrix.SHAPES["hot-prefix"]
    n = len(build_workload(shape, True, 7).requests)
    assert n != len(build_workload(shape, False, 7).requests)
    pods = ["a"] * n
    result = {"shape": "hot-prefix", "seed": 7, "quick": True, "rows": [
        {"label": "1 replica", "request_pods": pods},
        {"label": "old row", "request_pods": pods[:-1]},  # not this workload: left out
    ]}  # fmt: skip
    lines = same_pod([result], quick=False)
    assert len(lines) == 5 and lines[-1].startswith("| hot-prefix | 1 replica |")
    total = sum(
        int(c.split("/")[1].split(" ")[0]) for c in lines[-1].split("|")[3:-1] if c != " - "
    )
    assert total == n - 1
