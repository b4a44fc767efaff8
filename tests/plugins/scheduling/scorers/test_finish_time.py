"""finish-time-scorer: the pod where the request would finish first, in seconds."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.types import CycleState, Endpoint, RequestContext
from heimdall_proxy.plugins.scheduling.scorers.finish_time import (
    FinishTimeParams,
    FinishTimeScorer,
)
from tests.helpers import ep
from tests.plugins.helpers import ctx, ledger, req

NOW = 1000.0


def make(**params: object) -> FinishTimeScorer:
    return FinishTimeScorer("f", FinishTimeParams.model_validate(params), ledger())


def completion(max_tokens: int, model: str = "m", prompt_tokens: int = 100) -> object:
    body = {"prompt": "x" * (4 * prompt_tokens), "max_tokens": max_tokens}
    return req("completions", body, model=model)


def teach_pace(handle: PluginHandle | FinishTimeScorer, pod: Endpoint, tpot: float) -> None:
    """A stream on `pod` that ran to its end: first chunk after 0.1 s, then `tpot` a token."""
    load = handle.load
    c = ctx(completion(5), pod)  # type: ignore[arg-type]
    load.acquire(c.key, pod.name, now=NOW, ctx=c)
    c.chunk_arrived(1, NOW + 0.1)
    c.chunk_arrived(4, NOW + 0.1 + 4 * tpot)
    load.release(c.key)


def running(
    scorer: FinishTimeScorer, pod: Endpoint, max_tokens: int, streamed: int = 1, model: str = "m"
) -> RequestContext:
    """A stream in flight on `pod`, `streamed` of its `max_tokens` tokens out."""
    r = completion(max_tokens, model)
    r.stream = True  # type: ignore[attr-defined]
    c = ctx(r, pod)  # type: ignore[arg-type]
    c.key = f"{pod.name}-{len(list(scorer.load.attempts_on(pod.name)))}"
    scorer.load.acquire(c.key, pod.name, now=NOW, ctx=c)
    scorer.load.prompt_done(c.key, NOW)
    c.chunk_arrived(streamed, NOW)
    return c


def learn_depth(scorer: FinishTimeScorer, pods: list[Endpoint], depth: int = 1) -> None:
    """Teach the ledger's queue price that each pod runs `depth` + 1 requests at once: first
    tokens with `depth` requests ahead came at once, with `depth` + 1 ahead after a wait."""
    price = scorer.queue
    for pod in pods:
        for i in range(20):
            price.service.observe(pod.name, 1.0)
            ahead = depth + (i % 2)
            waited = 0.5 if ahead > depth else 0.0
            price.delay.observe(pod.name, 100.0 * ahead, waited, ahead, waited)


def test_no_pace_anywhere_scores_every_pod_the_same() -> None:
    scorer = make()
    a, b = ep("a"), ep("b")
    running(scorer, a, 1000)
    got = scorer.score(CycleState(), completion(10), [a, b])  # type: ignore[arg-type]
    assert dict(got) == {"a": 1.0, "b": 1.0}


def test_a_full_pod_whose_requests_end_soon_beats_one_whose_requests_just_began() -> None:
    scorer = make()
    soon, late = ep("soon"), ep("late")
    for pod in (soon, late):
        teach_pace(scorer, pod, 0.01)
    learn_depth(scorer, [soon, late])
    # both full (two slots), the same request count; soon's end within 50 tokens
    running(scorer, soon, 1000, streamed=990)
    running(scorer, soon, 1000, streamed=950)
    running(scorer, late, 1000, streamed=10)
    running(scorer, late, 1000, streamed=20)
    got = scorer.score(CycleState(), completion(100), [soon, late])  # type: ignore[arg-type]
    assert got["soon"] == 1.0
    # soon: 0.1 s to a slot + 1 s own; late: 9.8 s + 1 s
    assert got["late"] == pytest.approx((0.1 + 1.0 + 100 / 16000) / (9.8 + 1.0 + 100 / 16000))


def test_before_a_pod_is_seen_to_queue_everything_on_it_runs_at_once() -> None:
    scorer = make()
    a, b = ep("a"), ep("b")
    for pod in (a, b):
        teach_pace(scorer, pod, 0.01)
    running(scorer, a, 1000)
    running(scorer, a, 1000)
    got = scorer.score(CycleState(), completion(100), [a, b])  # type: ignore[arg-type]
    assert dict(got) == {"a": 1.0, "b": 1.0}  # the load scorers carry the load then


def test_a_slow_pod_costs_its_own_pace() -> None:
    scorer = make()
    fast, slow, new = ep("fast"), ep("slow"), ep("new")
    teach_pace(scorer, fast, 0.01)
    teach_pace(scorer, slow, 0.02)
    got = scorer.score(CycleState(), completion(100), [fast, slow, new])  # type: ignore[arg-type]
    own = 100 / 16000
    assert got["fast"] == 1.0
    assert got["slow"] == pytest.approx((own + 1.0) / (own + 2.0))
    # a pod with no stream of its own yet runs at the fleet's mean pace (15 ms)
    assert got["new"] == pytest.approx((own + 1.0) / (own + 1.5))
    # among the slow pod and a new one, the new one (at the fleet's pace) finishes first
    got = scorer.score(CycleState(), completion(100), [slow, new])  # type: ignore[arg-type]
    assert dict(got) == {"new": 1.0, "slow": pytest.approx((own + 1.5) / (own + 2.0))}


def test_the_prompt_a_pod_holds_is_not_prefilled_again() -> None:
    scorer = make()
    warm, cold = ep("warm"), ep("cold")
    for pod in (warm, cold):
        teach_pace(scorer, pod, 0.01)
    state = CycleState()
    key = prefix_match_key("approx-prefix-cache-producer", "approx-prefix-cache-producer")
    state[key] = PrefixCacheMatchInfo(16, 100, 1600, {"warm": 100.0})
    got = scorer.score(state, completion(10, prompt_tokens=1600), [warm, cold])  # type: ignore[arg-type]
    assert got["warm"] == 1.0
    assert got["cold"] == pytest.approx(0.1 / (0.1 + 1600 / 16000))


def test_a_lora_request_waits_where_another_adapter_fills_the_adapter_slot() -> None:
    scorer = make()
    busy = ep("busy", lora_running=("lora-a",), max_lora=1)
    free = ep("free", lora_running=("lora-b",), max_lora=1)
    for pod in (busy, free):
        teach_pace(scorer, pod, 0.01)
    running(scorer, busy, 500, model="lora-a")  # 5 s before its adapter slot frees
    running(scorer, free, 500, model="lora-b")
    got = scorer.score(CycleState(), completion(100, "lora-b"), [busy, free])  # type: ignore[arg-type]
    assert got["free"] == 1.0
    assert got["busy"] == pytest.approx((1.0 + 100 / 16000) / (4.99 + 1.0 + 100 / 16000), rel=1e-3)
    # a base-model request takes no adapter slot: both pods alike
    got = scorer.score(CycleState(), completion(100), [busy, free])  # type: ignore[arg-type]
    assert dict(got) == {"busy": 1.0, "free": 1.0}


def test_a_request_not_streamed_is_counted_down_by_its_age_at_the_pods_pace() -> None:
    scorer = make()
    a, b = ep("a"), ep("b")
    for pod in (a, b):
        teach_pace(scorer, pod, 0.01)  # first chunk after 0.1 s, then 10 ms a token
    learn_depth(scorer, [a, b])
    for pod in (a, b):
        running(scorer, pod, 1000, streamed=100)  # a slot held for 9 s on each
    plain = ctx(completion(1000), a)  # type: ignore[arg-type]
    scorer.load.acquire("plain", "a", now=NOW, ctx=plain)  # a's other slot: 1000 tokens, no stream
    running(scorer, b, 200, streamed=0)  # b's other slot: 2 s
    request = completion(10)  # 0.1 s of output, 100 prompt tokens: 6.25 ms of prefill
    own = 0.1 + 100 / 16000
    scorer.clock = lambda: NOW + 0.1  # nothing out yet by the pace: 10 s left on a
    got = scorer.score(CycleState(), request, [a, b])  # type: ignore[arg-type]
    assert got["b"] == 1.0 and got["a"] < 0.5
    scorer.clock = lambda: NOW + 9.1  # 900 tokens out by now: 1 s left, sooner than b's 2 s
    got = scorer.score(CycleState(), request, [a, b])  # type: ignore[arg-type]
    assert got["a"] == 1.0 and got["b"] == pytest.approx((1.0 + own) / (2.0 + own), rel=0.01)
    scorer.clock = lambda: NOW + 60.0  # past its limit by the pace, still running: one token
    got = scorer.score(CycleState(), request, [a, b])  # type: ignore[arg-type]
    assert got["a"] == 1.0 and got["b"] == pytest.approx((0.01 + own) / (2.0 + own), rel=0.01)
