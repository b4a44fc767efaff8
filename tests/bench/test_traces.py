"""Mooncake's traces (bench/harness/traces.py and the committed samples) and the trace and
shared-prefix workloads: prompts share exactly the prefixes the trace says, time is scaled by
the documented rule, and whole conversations are kept."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest

from bench.harness import traces
from bench.harness import workloads as wl
from bench.harness.costs import pod_work
from heimdall_proxy.sim.options import SimOptions
from heimdall_proxy.sim.tokens import Tokenizer


def tr(ts: float, hashes: tuple[int, ...], inp: int | None = None) -> traces.TraceRequest:
    return traces.TraceRequest(ts, inp or 512 * len(hashes), 10, hashes)


def test_conversations_are_read_off_the_hash_ids() -> None:
    reqs = [
        tr(0, (0, 1, 2)),  # conversation A, turn 1
        tr(1, (0, 5, 6)),  # B: shares only the system block 0 with A
        tr(2, (0, 1, 2, 3, 4)),  # A, turn 2: all of turn 1's blocks
        tr(3, (0, 5, 7, 8)),  # B, turn 2: turn 1's full blocks (its last one was partial)
        tr(4, (0, 1, 9)),  # shares 2 blocks of A's 5: a new conversation
    ]
    assert traces.conversations(reqs) == [[0, 2], [1, 3], [4]]


def test_a_sample_keeps_whole_conversations_and_is_reproducible(tmp_path: Path) -> None:
    reqs = [
        tr(i, (0, 100 + i // 3, *range(1000 + 10 * i, 1000 + 10 * i + i % 3))) for i in range(30)
    ]
    a = traces.sample(reqs, min_requests=5, seed=1)
    assert a == traces.sample(reqs, min_requests=5, seed=1)
    groups = traces.conversations(reqs)
    kept = {r.timestamp_ms for r in a}
    for g in groups:  # all of a conversation or none of it
        assert len({reqs[i].timestamp_ms in kept for i in g}) == 1
    traces.write(tmp_path / "s.jsonl.gz", a)
    assert traces.load(tmp_path / "s.jsonl.gz") == a
    with gzip.open(tmp_path / "s.jsonl.gz") as f:
        lines = f.read().decode().splitlines()
    assert [json.loads(line) for line in lines] == [r.to_json() for r in a]


@pytest.mark.parametrize("name", sorted(traces.SAMPLES))
def test_the_committed_samples_are_small_whole_and_fit_the_pods(name: str) -> None:
    path = traces.SAMPLES[name]
    assert path.stat().st_size < 300_000
    reqs = traces.load(path)
    assert len(reqs) >= traces.SAMPLE_REQUESTS
    assert all(r.input_length + r.output_length <= traces.MAX_TOKENS for r in reqs)
    assert all(r.conversation >= 0 for r in reqs)
    assert reqs == sorted(reqs, key=lambda r: (r.timestamp_ms, r.conversation))
    readme = (path.parent / "README.md").read_text(encoding="utf-8")
    assert path.name in readme and "Apache-2.0" in readme


@pytest.mark.slow  # simulates whole shapes: seconds of CPU
def test_trace_prompts_share_exactly_the_blocks_the_trace_shares() -> None:
    w = wl.build("mooncake-conversation", overrides={"conversations": "40"})
    reqs = traces.first_conversations(traces.load(traces.SAMPLES["conversation"]), 40)
    tok = Tokenizer()
    ids = [tok.prompt("completions", r.body).ids for r in w.requests]
    assert len(ids) == len(reqs)
    for r, i in zip(reqs, ids, strict=True):
        assert len(i) == r.input_length + 1  # BOS, then one token per trace token
    checked = 0
    for a in range(len(reqs)):
        for b in range(a + 1, min(len(reqs), a + 15)):
            ha, hb = reqs[a].hash_ids, reqs[b].hash_ids
            k = 0
            while k < min(len(ha), len(hb)) and ha[k] == hb[k]:
                k += 1
            common = 0
            while common < min(len(ids[a]), len(ids[b])) and ids[a][common] == ids[b][common]:
                common += 1
            shared = min(1 + 512 * k, len(ids[a]), len(ids[b]))
            if k < min(len(ha), len(hb)):
                assert common == shared  # they part where the hash ids part
            else:
                assert common >= shared
            checked += 1
    assert checked > 100


def test_trace_time_is_scaled_to_the_target_utilisation() -> None:
    w = wl.build("mooncake-synthetic", overrides={"conversations": "30", "utilisation": "0.5"})
    reqs = traces.first_conversations(traces.load(traces.SAMPLES["synthetic"]), 30)
    hits = wl._trace_hits(reqs, 512)
    o = SimOptions()
    work = sum(
        pod_work(r.input_length, h, r.output_length, o) for r, h in zip(reqs, hits, strict=True)
    )
    assert w.duration == pytest.approx(work / (0.5 * 4), rel=1e-4)
    # the order and relative gaps of the trace are kept
    span = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000
    scale = w.params["time_scale"]
    for r, t in zip(reqs, w.requests, strict=True):
        assert t.offset == pytest.approx((r.timestamp_ms - reqs[0].timestamp_ms) / 1000 * scale)
    assert scale * span == pytest.approx(w.duration)


def test_a_full_trace_given_by_path_is_sampled_as_the_committed_sample(tmp_path: Path) -> None:
    full = [tr(i * 1000, (0, 100 + i % 7, 200 + i)) for i in range(60)]
    path = tmp_path / "full.jsonl"
    traces.write(path, [traces.TraceRequest(r.timestamp_ms, r.input_length, r.output_length,
                                            r.hash_ids) for r in full])  # fmt: skip
    path.write_text(path.read_text().replace(',"conversation":-1', ""))
    w = wl.build("mooncake-conversation", overrides={"path": str(path), "sample_requests": "10"})
    assert len(w.requests) == len(traces.sample(full, 10))


def test_shared_prefix_groups_users_and_rounds_as_inference_perf() -> None:
    w = wl.build("shared-prefix", overrides={"groups": "3", "prompts_per_group": "4",
                                             "system_prompt_len": "64", "question_len": "8",
                                             "output_len": "5", "rounds": "3"})  # fmt: skip
    assert len(w.requests) == 3 * 4 * 3
    prompts = {r.id: r.body["prompt"] for r in w.requests}
    by_group: dict[str, set[str]] = {}
    for rid, p in prompts.items():
        by_group.setdefault(rid[:3], set()).add(" ".join(p.split()[:64]))
    assert len(by_group) == 3 and all(len(v) == 1 for v in by_group.values())
    for rid, p in prompts.items():
        if rid.endswith("-r1"):  # round 1 resends round 0 and its reply
            assert p.startswith(prompts[rid[:-1] + "0"] + " ")
            assert len(p.split()) == 64 + 8 + 5 + 8
    offsets = [r.offset for r in w.requests]
    assert offsets == sorted(offsets)
    gaps = {round(b - a, 9) for a, b in itertools.pairwise(offsets)}
    assert len(gaps) <= 2  # a constant rate (rounding aside)
    single = wl.build("shared-prefix", overrides={"multi_turn": "false", "rounds": "3"})
    assert len(single.requests) == 96
