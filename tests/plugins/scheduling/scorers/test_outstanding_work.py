"""outstanding-work-scorer: work, not request counts."""

from __future__ import annotations

from typing import Any

import pytest

from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.types import CycleState, output_cap
from heimdall_proxy.plugins.scheduling.scorers.outstanding_work import (
    OutstandingWorkParams,
    OutstandingWorkScorer,
)
from tests.helpers import ep
from tests.plugins.helpers import ctx, ledger, req, streamed, teach_pace


def make(**params: object) -> OutstandingWorkScorer:
    return OutstandingWorkScorer("w", OutstandingWorkParams.model_validate(params), ledger())


def completion(prompt_tokens: int, max_tokens: int) -> object:
    return req("completions", {"prompt": "x" * (4 * prompt_tokens), "max_tokens": max_tokens})


async def test_one_heavy_request_outweighs_ten_short_ones() -> None:
    scorer = make()
    heavy_pod, busy_pod, idle = ep("heavy"), ep("busy"), ep("idle")
    await scorer.pre_request(ctx(completion(5000, 1000), heavy_pod))  # type: ignore[arg-type]
    for _ in range(10):
        await scorer.pre_request(ctx(completion(15, 30), busy_pod))  # type: ignore[arg-type]
    assert scorer.work("heavy") == pytest.approx(0.2 * 5000 + 1000)
    assert scorer.work("busy") == pytest.approx(10 * (0.2 * 15 + 30))
    got = scorer.score(CycleState(), req(), [heavy_pod, busy_pod, idle])
    assert got["idle"] == 1.0
    assert got["busy"] > 0.6 > got["heavy"] == 0.0


async def test_progress_prefill_then_streamed_tokens_then_complete() -> None:
    scorer = make()
    pod = ep("p")
    c = ctx(completion(100, 10), pod)  # type: ignore[arg-type]
    await scorer.pre_request(c)
    assert scorer.work("p") == pytest.approx(20 + 10)
    await scorer.response_received(c)  # the headers: prefill stops counting
    assert scorer.work("p") == pytest.approx(10)
    await streamed(scorer, c, b'data: {"a":1}\n\ndata: {"a":2}\n\n')
    assert scorer.work("p") == pytest.approx(8)
    await streamed(scorer, c, b"data: x\n\n" * 50)
    assert scorer.work("p") == 0.0
    await scorer.response_complete(c)
    await scorer.response_complete(c)
    assert scorer.work("p") == 0.0
    assert scorer.score(CycleState(), req(), [pod]) == {"p": 1.0}


async def test_a_prompt_the_pod_holds_costs_no_prefill() -> None:
    # the default approx producer's match on the cycle: pod "warm" holds 75 of 100 prompt tokens.
    scorer = make()
    warm, cold = ep("warm"), ep("cold")
    key = prefix_match_key("approx-prefix-cache-producer", "approx-prefix-cache-producer")
    info = PrefixCacheMatchInfo(25, 4, 100, {"warm": 3.0})
    for pod in (warm, cold):
        c = ctx(completion(100, 10), pod)  # type: ignore[arg-type]
        c.state[key] = info
        await scorer.pre_request(c)
    assert scorer.work("warm") == pytest.approx(0.2 * 25 + 10)
    assert scorer.work("cold") == pytest.approx(0.2 * 100 + 10)
    other = make(prefixPluginName="another")  # a match it was not told to read: all prefill
    c = ctx(completion(100, 10), warm)  # type: ignore[arg-type]
    c.state[key] = info
    await other.pre_request(c)
    assert other.work("warm") == pytest.approx(0.2 * 100 + 10)


def test_output_cap_and_the_default_for_a_request_without_one() -> None:
    assert output_cap({"max_tokens": 7}) == 7
    assert output_cap({"max_completion_tokens": 9, "max_tokens": 7}) == 9
    assert output_cap({"max_output_tokens": 5}) == 5
    assert output_cap({"max_tokens": 4, "n": 3}) == 12
    assert output_cap({}) is None
    assert output_cap({"max_tokens": "x"}) is None
    assert output_cap({"max_tokens": True}) is None
    # a request that sets none counts defaultOutputTokens of decode work
    assert make().estimate(req("completions", {"prompt": "x"}))[1] == 256
    assert make(defaultOutputTokens=100).estimate(req("completions", {"prompt": "x"}))[1] == 100


async def test_real_token_ids_are_used_when_present() -> None:
    scorer = make(prefillTokenWeight=1.0)
    r = req("completions", {"prompt": "x" * 4000, "max_tokens": 1})
    r.token_ids = [1, 2, 3]
    assert scorer.estimate(r) == (3.0, 1.0)


class Clock:
    """The scorer's clock, moved by the test (no sleeping, no timing asserted)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def run_stream(scorer: OutstandingWorkScorer, clock: Clock, pod: object, **kw: Any) -> None:
    """A stream on `pod` as the relay runs it: first chunk 0.5 s after it was sent, then one
    token every 0.1 s; the gateway's ledger learns the pod's pace from it."""
    r = completion(100, 10)
    r.stream = True  # type: ignore[attr-defined]
    c = ctx(r, pod, **kw)  # type: ignore[arg-type]
    c.started_at = clock.now
    scorer.load.acquire(c.key, c.target.name, now=clock.now, ctx=c)
    await scorer.pre_request(c)
    for dt in (0.5, 0.1, 0.1, 0.1):
        clock.now += dt
        await streamed(scorer, c, b"data: {}\n\n", clock.now)
    scorer.load.release(c.key)
    await scorer.response_complete(c)


async def test_a_non_streamed_request_counts_down_at_the_pods_observed_pace() -> None:
    scorer, clock, pod = make(), Clock(), ep("p")
    scorer.clock = clock
    plain = ctx(completion(100, 10), pod)  # type: ignore[arg-type]
    plain.started_at = clock.now
    await scorer.pre_request(plain)
    clock.now += 60.0
    assert scorer.work("p") == pytest.approx(20 + 10)  # no stream seen yet: no pace, in full
    await scorer.response_complete(plain)

    await run_stream(scorer, clock, pod)  # time to first chunk 0.5 s, 0.1 s per token
    c = ctx(completion(100, 10), pod, attempt=1)  # type: ignore[arg-type]
    c.started_at = clock.now
    await scorer.pre_request(c)
    clock.now += 0.4  # still prefilling by that pace
    assert scorer.work("p") == pytest.approx(20 + 10)
    clock.now += 0.4  # 0.3 s past the first token: 3 tokens out
    assert scorer.work("p") == pytest.approx(7)
    clock.now += 60.0  # past its limit by the pace, but not answered: one token left
    assert scorer.work("p") == pytest.approx(1)
    await scorer.response_complete(c)
    assert scorer.work("p") == 0.0


async def test_only_streams_that_ran_to_their_end_set_the_pace() -> None:
    scorer, clock, pod = make(), Clock(), ep("p")
    scorer.clock = clock
    r = completion(100, 10)
    r.stream = True  # type: ignore[attr-defined]
    broken = ctx(r, pod)  # type: ignore[arg-type]
    broken.started_at = clock.now
    scorer.load.acquire(broken.key, pod.name, now=clock.now, ctx=broken)
    await scorer.pre_request(broken)
    clock.now += 0.5
    await streamed(scorer, broken, b"data: {}\n\n", clock.now)
    broken.error = "read failed"
    scorer.load.release(broken.key)
    await scorer.response_complete(broken)
    c = ctx(completion(100, 10), pod, attempt=1)  # type: ignore[arg-type]
    c.started_at = clock.now
    await scorer.pre_request(c)
    clock.now += 60.0
    assert scorer.work("p") == pytest.approx(20 + 10)


@pytest.mark.parametrize("scaled", [False, True])
async def test_scale_by_pod_speed_counts_a_slow_pods_work_in_its_time(scaled: bool) -> None:
    # Equal work on three pods: "slow" was seen at twice "fast"'s time per token at the same
    # batch, "new" has no pace yet (the candidates' mean speed, 1.5x fast's).
    scorer = make(scaleByPodSpeed=scaled)
    fast, slow, new, idle = ep("fast"), ep("slow"), ep("new"), ep("idle")
    teach_pace(scorer, fast, 0.01)
    teach_pace(scorer, slow, 0.02)
    for pod in (fast, slow, new):
        r = completion(100, 50)
        r.stream = True  # type: ignore[attr-defined]  # no count-down by age
        await scorer.pre_request(ctx(r, pod))  # type: ignore[arg-type]
    got = scorer.score(CycleState(), req(), [fast, slow, new, idle])
    assert got["idle"] == 1.0
    if scaled:
        assert got["slow"] == 0.0
        assert got["fast"] == pytest.approx(0.5, abs=0.02)
        assert got["new"] == pytest.approx(0.25, abs=0.02)
    else:
        assert got["fast"] == got["slow"] == got["new"] == 0.0


async def test_scale_by_pod_speed_with_every_busy_pod_paced_reads_their_own_speeds() -> None:
    # no busy pod lacks a pace: the other pods' paces (an idle one much faster) do not count
    scorer = make(scaleByPodSpeed=True)
    fast, slow, idle = ep("fast"), ep("slow"), ep("idle")
    teach_pace(scorer, fast, 0.01)
    teach_pace(scorer, slow, 0.02)
    teach_pace(scorer, idle, 0.001)
    for pod in (fast, slow):
        r = completion(100, 50)
        r.stream = True  # type: ignore[attr-defined]  # no count-down by age
        await scorer.pre_request(ctx(r, pod))  # type: ignore[arg-type]
    got = scorer.score(CycleState(), req(), [fast, slow, idle])
    assert got["idle"] == 1.0 and got["slow"] == 0.0
    assert got["fast"] == pytest.approx(0.5, abs=0.02)
