"""bench/matrix.py and its workloads: deterministic shapes and a lower bound that is one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench import matrix
from bench.harness import workloads as wl
from bench.harness.targets import parse_target
from heimdall_proxy.sim.options import SimOptions


def test_hot_prefix_is_skewed_and_deterministic() -> None:
    a = wl.build("hot-prefix", overrides={"requests": "400"})
    b = wl.build("hot-prefix", overrides={"requests": "400"})
    assert [r.to_json() for r in a.requests] == [r.to_json() for r in b.requests]
    systems = Counter(r.body["messages"][0]["content"] for r in a.requests)
    assert len(systems) == 5
    top = systems.most_common(1)[0][1] / len(a.requests)
    assert 0.4 <= top <= 0.6  # one prompt takes about half (>= 40%, as issue 12 asks)
    assert len({r.body["messages"][1]["content"] for r in a.requests}) == 400  # users differ


def test_mixed_has_sessions_adapters_and_long_prompts() -> None:
    w = wl.build("mixed")
    tags = Counter(r.tag for r in w.requests)
    assert set(tags) == {"session", "short", "long"}
    models = {r.body["model"] for r in w.requests}
    assert models == {"sim-model", "lora-a", "lora-b"}
    sessions = [r for r in w.requests if r.tag == "session"]
    assert all(r.headers["x-session-token"].startswith("session-") for r in sessions)
    # a session's later turn resends the earlier ones
    by = {}
    for r in sessions:
        by.setdefault(r.headers["x-session-token"], []).append(len(r.body["messages"]))
    assert any(lengths == sorted(lengths) and len(lengths) > 2 for lengths in by.values())


def test_service_time_follows_the_simulator_cost_model() -> None:
    o = SimOptions()
    alone = matrix.service_time(1000, 0, 1, o)
    assert alone == pytest.approx(o.step_base + 1000 * o.prefill_cost_per_token)
    cached = matrix.service_time(1000, 992, 1, o)
    assert cached == pytest.approx(o.step_base + 8 * o.prefill_cost_per_token)
    longer = matrix.service_time(1000, 0, 11, o)
    assert longer > alone + 10 * o.step_base


def test_pod_work_shares_step_cost_but_not_prefill_across_slots() -> None:
    o = SimOptions()
    assert matrix.pod_work(1000, 0, 1, o, slots=2) == pytest.approx(
        o.step_base / 2 + 1000 * o.prefill_cost_per_token
    )
    # two prompts on one pod cost twice one prompt's prefill, however many slots it has
    assert matrix.pod_work(4000, 0, 1, o, slots=8) > 4000 * o.prefill_cost_per_token


def test_the_lower_bound_counts_shared_prefixes_once_and_slow_pods_at_their_speed() -> None:
    w = matrix.build_workload(matrix.SHAPES["hot-prefix"], quick=True)
    fast = matrix.lower_bound(w, [1.0] * 4)
    assert fast.cached <= fast.cold
    assert fast.capacity == 4
    slow = matrix.lower_bound(w, [1.0, 1.0, 0.5, 0.5])
    assert slow.capacity == 3
    assert slow.cold >= fast.cold
    assert fast.cold >= w.duration  # never below the last send


def test_cold_burst_has_no_shared_prefix_so_both_bounds_agree() -> None:
    w = matrix.build_workload(matrix.SHAPES["cold-burst"], quick=True)
    b = matrix.lower_bound(w, [1.0] * 4)
    assert b.cold == pytest.approx(b.cached)
    assert b.cold > w.duration  # the burst overloads the fleet: work, not arrivals, bounds it


def test_greedy_dispatch_packs_slots_on_arrival() -> None:
    jobs = [(0.0, 4.0), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0)]
    assert matrix.greedy_dispatch(jobs, [1.0, 1.0], slots=1) == 4.0  # 4 | 1+1+1+1
    assert matrix.greedy_dispatch(jobs, [1.0, 0.5], slots=1) == 6.0  # slow pod: 2 shorts in 4
    b = matrix.lower_bound(matrix.build_workload(matrix.SHAPES["cold-burst"], True), [1.0] * 4)
    # the per-slot model ignores prefill interference, so it may fall a little under the bound
    assert 0.8 * b.cold <= b.greedy <= 1.25 * b.cold


def test_tables_render_from_a_saved_summary() -> None:
    doc = {
        "shapes": {
            "x": {
                "description": "(z) a shape",
                "workload": "x: 2 requests",
                "lower_bound": {"cold": 10.0, "cached": 8.0, "capacity_pods": 4,
                                "last_send": 5.0, "greedy_dispatch": 9.0},
                "targets": {
                    "vllm-router round_robin": {"total": 16.0, "ttft": {"p50": 1, "p95": 2,
                        "p99": 3}, "e2e": {"p50": 1, "p95": 4, "p99": 5},
                        "prefix_hit_rate": 0.5, "errors": 0},
                    "heimdall-proxy r.yaml": {"total": 12.0, "ttft": {"p50": 1, "p95": 2,
                        "p99": 3}, "e2e": {"mean": 2.2, "p50": 1, "p95": 3, "p99": 5},
                        "prefix_hit_rate": 0.75, "errors": 0},
                },
            }
        }
    }  # fmt: skip
    text = matrix.render(doc)
    # no oracle in a summary saved before it existed: its ratios are left blank
    assert "| heimdall-proxy r.yaml | 12.0 | 1.50x | - | - | 0.75x |" in text
    doc["shapes"]["x"]["oracle"] = {"e2e_mean": 2.0, "e2e_p95": 2.5, "total": 11.0,
                                    "prefix_hit_rate": 0.8}  # fmt: skip
    text = matrix.render(doc)
    assert "| heimdall-proxy r.yaml | 12.0 | 1.50x | 1.10x | 1.20x | 0.75x |" in text
    assert "E2E mean **2.00 s**, p95 **2.50 s**, total 11.0 s" in text
    assert "| 0.75x | 75.0% | 0 |" in text  # E2E p95 3 / 4, hit rate
    assert "would take 9.0 s (1.12x the bound)" in text


def test_the_cold_mixed_shape_is_all_cold_and_spans_twenty_times() -> None:
    w = matrix.build_workload(matrix.SHAPES["cold-mixed"], quick=True)
    prompts = [r.body["prompt"] for r in w.requests]
    assert len(prompts) == 120 and len(set(prompts)) == 120  # every prompt distinct
    starts = {p[:64] for p in prompts}
    assert len(starts) == 120  # and distinct from its first block on: nothing to share
    sizes = sorted(len(p) for p in prompts)
    assert sizes[-1] >= 10 * sizes[0]


@pytest.mark.slow  # simulates whole shapes: seconds of CPU
def test_the_real_trace_shapes_are_in_the_matrix() -> None:
    for key in ("mooncake-conversation", "mooncake-synthetic", "shared-prefix"):
        shape = matrix.SHAPES[key]
        quick = matrix.build_workload(shape, quick=True)
        full = matrix.build_workload(shape, quick=False)
        assert 90 <= len(quick.requests) < len(full.requests)
        assert quick.duration < 90  # a couple of minutes per target with the drain


def _summary(targets: dict[str, object], seed: int = 42) -> dict[str, object]:
    return {
        "mode": "quick", "seed": seed, "pods": 4,
        "shapes": {"shared-prefix": {
            "description": "(i) shared prefix", "workload": "w",
            "lower_bound": {"cold": 10.0, "cached": 8.0, "capacity_pods": 4, "last_send": 5.0},
            "oracle": {"e2e_mean": 2.0, "e2e_p95": 4.0, "total": 8.8, "prefix_hit_rate": 0.8},
            "targets": targets,
        }},
    }  # fmt: skip


RUN = {"total": 12.0, "ttft": {"p50": 1, "p95": 2, "p99": 3},
       "e2e": {"mean": 2.2, "p50": 1, "p95": 5.0, "p99": 6}, "prefix_hit_rate": 0.75,
       "errors": 1}  # fmt: skip


def test_split_summaries_merge_into_one_oracle_table() -> None:
    a = _summary({"vllm-router round_robin": RUN})
    b = _summary({"heimdall-proxy pd.yaml": {"not_run": "pod-0 exited"}})
    doc = matrix.merge([a, b])
    assert list(doc["shapes"]["shared-prefix"]["targets"]) == [
        "vllm-router round_robin", "heimdall-proxy pd.yaml",
    ]  # fmt: skip
    lines = matrix.oracle_table(doc)
    assert (
        "| (i) inference-perf shared prefix | oracle (simulated) | 2.00 s | 4.00 s | 1.10x"
        in (lines[2])
    )
    assert lines[3] == (
        "| (i) inference-perf shared prefix | round_robin | 1.10x | 1.25x | 1.50x | 75.0% | 1 |"
    )
    assert lines[4].startswith("| (i) inference-perf shared prefix | pd.yaml | not run: pod-0")
    # the full tables say so too, and do not take a run that did not happen as the RR baseline
    text = matrix.render(doc)
    assert "| heimdall-proxy pd.yaml | not run: pod-0 exited |" in text
    with pytest.raises(ValueError, match="seed"):
        matrix.merge([a, _summary({}, seed=7)])


def test_render_merges_files_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = []
    for i, targets in enumerate(({"vllm-router round_robin": RUN}, {"heimdall-proxy x.yaml": RUN})):
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps({**_summary(targets), "shapes": {"unknown-shape": _summary(
            targets)["shapes"]["shared-prefix"]}}))  # fmt: skip
        paths.append(str(path))
    assert matrix.main(["--render", *paths, "--brief"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[1] for line in out[3:]] == ["round_robin", "x.yaml"]


@pytest.mark.slow  # starts a simulated pod and, twice, a gateway that exits
def test_a_target_that_cannot_start_is_a_row_not_the_end_of_the_matrix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins:\n- type: no-such-plugin\n")
    res = matrix.run_shape(
        matrix.SHAPES["shared-prefix"], [parse_target(str(bad))], True, 1, tmp_path
    )
    assert not res.runs
    assert list(res.not_run) == ["heimdall-proxy bad.yaml"]
    assert "exited" in res.not_run["heimdall-proxy bad.yaml"]
    assert "| bad.yaml | not run: " in "\n".join(matrix.oracle_table(matrix.summary_json([res])))
