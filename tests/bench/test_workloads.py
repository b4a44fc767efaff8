"""bench/harness/workloads.py: deterministic generators with the reference workload's shape."""

from __future__ import annotations

import argparse
from collections import Counter
from itertools import pairwise

import pytest

from bench.harness import workloads as wl
from bench.harness.workloads import (
    HEAVY_SPECS,
    ChatPrefixParams,
    ContextMixParams,
    Seed001Params,
    TimedRequest,
)


def _words(req: TimedRequest) -> int:
    """Prompt length in words, without the leading `[id]` tag."""
    prompt = req.body["prompt"]
    assert prompt.startswith(f"[{req.id}] ")
    return len(prompt.split()) - 1


@pytest.fixture(scope="module")
def reference() -> wl.Workload:
    return wl.seed001()


@pytest.mark.slow
def test_every_generator_is_deterministic() -> None:
    for name in wl.PRESETS:
        a = wl.build(name, seed=7).to_json()
        b = wl.build(name, seed=7).to_json()
        assert a == b, name
        assert a != wl.build(name, seed=8).to_json(), name


def test_reference_counts(reference: wl.Workload) -> None:
    # --heavy-seeds 400 --total 800 --inline-every 24: 400 // 25 = 16 inline heavies and the
    # remaining 384 split evenly between short and medium.
    assert len(reference.requests) == 800
    assert reference.counts() == {
        "heavy-seed": 400,
        "heavy-inline": 16,
        "short": 192,
        "medium": 192,
    }
    assert len({r.id for r in reference.requests}) == 800
    assert all(r.path == "/v1/completions" for r in reference.requests)


def test_reference_heavy_specs_cycle(reference: wl.Workload) -> None:
    seeds = [r for r in reference.requests if r.tag == "heavy-seed"]
    assert reference.requests[:400] == seeds
    for i, req in enumerate(seeds):
        isl, osl = HEAVY_SPECS[i % 4]
        assert _words(req) == isl
        assert req.body["max_tokens"] == osl
    inline = [r for r in reference.requests if r.tag == "heavy-inline"]
    assert [r.body["max_tokens"] for r in inline] == [HEAVY_SPECS[k % 4][1] for k in range(16)]


def test_reference_inline_positions(reference: wl.Workload) -> None:
    burst = reference.requests[400:]
    positions = [i for i, r in enumerate(burst) if r.tag == "heavy-inline"]
    # One heavy after every 24 burst items: burst indices 24, 49, 74, ...
    assert positions == [25 * k + 24 for k in range(16)]


def test_reference_short_and_medium_lengths(reference: wl.Workload) -> None:
    for req in reference.requests:
        if req.tag == "short":
            assert 10 <= _words(req) <= 20
            assert 25 <= req.body["max_tokens"] <= 40
        elif req.tag == "medium":
            assert 120 <= _words(req) <= 180
            assert 60 <= req.body["max_tokens"] <= 90
    shorts = Counter(_words(r) for r in reference.requests if r.tag == "short")
    assert len(shorts) > 5  # drawn, not constant


def test_reference_timing(reference: wl.Workload) -> None:
    reqs = reference.requests
    assert all(r.offset == 0.0 for r in reqs[:400])  # --seed-interval 0
    burst = reqs[400:]
    assert burst[0].offset == 5.0  # --burst-start 5
    for prev, nxt in pairwise(burst):
        gap = nxt.offset - prev.offset
        if prev.tag == "heavy-inline":  # --inline-extra-gap 0.5 on top of 0.5 +/- 0.5
            assert 0.5 - 1e-6 <= gap <= 1.5 + 1e-6
        else:
            assert -1e-6 <= gap <= 1.0 + 1e-6
    gaps = [b.offset - a.offset for a, b in pairwise(burst)]
    assert 0.4 < sum(gaps) / len(gaps) < 0.6  # jitter averages out
    assert 190 < reference.duration < 240


def test_seed001_timing_without_jitter() -> None:
    p = Seed001Params(
        total=10, heavy_seeds=4, inline_every=2, seed_interval=0.1, burst_start=1.0, jitter=0
    )
    w = wl.seed001(p)
    tags = [r.tag for r in w.requests]
    assert tags[:4] == ["heavy-seed"] * 4
    assert [i for i, t in enumerate(tags) if t == "heavy-inline"] == [6, 9]
    offsets = [r.offset for r in w.requests]
    assert offsets[:4] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    expected, t = [], 1.0
    for r in w.requests[4:]:
        expected.append(t)
        t += 0.5 + (0.5 if r.tag == "heavy-inline" else 0.0)
    assert offsets[4:] == pytest.approx(expected)


def test_explicit_inline_count_and_small_preset() -> None:
    w = wl.seed001(Seed001Params(total=100, heavy_seeds=10, inline_heavy_count=9))
    assert w.counts()["heavy-inline"] == 9
    assert len(w.requests) == 100
    small = wl.build("seed001-small")
    assert small.counts() == {"heavy-seed": 100, "heavy-inline": 4, "short": 48, "medium": 48}


def test_stream_flag_and_scaling() -> None:
    w = wl.build("seed001-small")
    short = next(r for r in w.requests if r.tag == "short")
    assert short.body["stream"] is True
    assert short.body["stream_options"] == {"include_usage": True}
    assert short.body["model"] == "sim-model"
    # Heavies are not streamed unless asked: they would only measure the relays' CPU.
    assert all(r.body["stream"] is False for r in w.requests if r.tag.startswith("heavy"))
    streamed = wl.build("seed001-small", overrides={"stream_heavy": "true"})
    assert all(r.body["stream"] is True for r in streamed.requests)
    plain = wl.build("seed001-small", stream=False, model="m")
    assert all(r.body["stream"] is False for r in plain.requests)
    assert all("stream_options" not in r.body for r in plain.requests)
    assert plain.requests[0].body["model"] == "m"
    half = w.scaled(0.5)
    assert [r.offset for r in half.requests] == pytest.approx([r.offset * 0.5 for r in w.requests])
    assert half.params["time_scale"] == 0.5
    assert w.scaled(1.0) is w


def test_chat_prefix_history_grows_and_prefixes_are_shared() -> None:
    p = ChatPrefixParams(users=6, system_prompts=2, system_words=50, turns=4)
    w = wl.chat_prefix(p)
    assert len(w.requests) == 24
    assert w.counts() == {"first-turn": 6, "follow-up": 18}
    assert [r.offset for r in w.requests] == sorted(r.offset for r in w.requests)
    by_user: dict[str, list[TimedRequest]] = {}
    for r in w.requests:
        assert r.path == "/v1/chat/completions"
        by_user.setdefault(r.id.split("-")[0], []).append(r)
    systems = []
    for turns in by_user.values():
        turns.sort(key=lambda r: r.id)
        assert [len(r.body["messages"]) for r in turns] == [2, 4, 6, 8]
        for prev, nxt in pairwise(turns):
            assert nxt.offset > prev.offset
            # Each turn resends the whole history: the previous messages are a prefix.
            assert nxt.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
            assert nxt.body["messages"][len(prev.body["messages"])]["role"] == "assistant"
        systems.append(turns[0].body["messages"][0]["content"])
    assert len(set(systems)) == 2  # users share their group's system prompt
    assert len(systems[0].split()) > 50


def test_context_mix_bands() -> None:
    p = ContextMixParams(requests=200, rate=10.0)
    w = wl.context_mix(p)
    counts = w.counts()
    assert set(counts) == {"short", "medium", "long"}
    assert counts["short"] > counts["medium"] > counts["long"] > 0
    bands = {"short": p.short_tokens, "medium": p.medium_tokens, "long": p.long_tokens}
    for r in w.requests:
        lo, hi = bands[r.tag]
        assert 4 * lo - 8 <= len(r.body["prompt"]) <= 4 * hi
    offsets = [r.offset for r in w.requests]
    assert offsets == sorted(offsets)
    assert 10 < offsets[-1] < 30  # ~200 arrivals at 10/s


def test_overrides() -> None:
    p = wl.apply_overrides(
        ChatPrefixParams(), {"users": "3", "think-time": "1,2", "reply_tokens": "[5, 6]"}
    )
    assert (p.users, p.think_time, p.reply_tokens) == (3, (1, 2), (5, 6))
    specs = wl.apply_overrides(Seed001Params(), {"heavy_specs": "[[10, 5], [20, 6]]"})
    assert specs.heavy_specs == ((10, 5), (20, 6))
    with pytest.raises(ValueError, match="unknown parameter"):
        wl.apply_overrides(Seed001Params(), {"nope": "1"})
    with pytest.raises(ValueError, match="unknown workload"):
        wl.build("nope")


def test_cli_flags_as_in_the_reference() -> None:
    parser = argparse.ArgumentParser()
    wl.add_workload_args(parser)
    args = parser.parse_args(
        ["-w", "seed001", "--total", "60", "--heavy-seeds", "10", "--inline-every", "9"]
    )
    w = wl.workload_from_args(args)
    assert w.counts() == {"heavy-seed": 10, "heavy-inline": 5, "short": 22, "medium": 23}
    args = parser.parse_args(["-w", "chat-prefix-small", "-P", "users=2", "-P", "turns=2"])
    assert len(wl.workload_from_args(args).requests) == 4
    args = parser.parse_args(["-w", "chat-prefix-small", "--total", "5"])
    with pytest.raises(ValueError, match="seed001"):
        wl.workload_from_args(args)
