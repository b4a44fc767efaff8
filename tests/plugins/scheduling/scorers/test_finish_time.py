"""finish-time-scorer: the pod where the request would finish first, in seconds."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.engine_model import Job, alone_seconds, finish_seconds, pod_speeds
from heimdall_proxy.framework.pace import Pace
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.types import CycleState, Endpoint, RequestContext
from heimdall_proxy.plugins.scheduling.scorers.finish_time import (
    FinishTimeParams,
    FinishTimeScorer,
)
from tests.helpers import ep
from tests.plugins.helpers import ctx, ledger, req, teach_pace

NOW = 1000.0


def speed(scorer: FinishTimeScorer, pace: Pace | None) -> float | None:
    """The speed the scorer reads a pod with this pace at."""
    return None if pace is None else pod_speeds({"p": pace}, {"p"}, scorer.costs).get("p")


def make(**params: object) -> FinishTimeScorer:
    scorer = FinishTimeScorer("f", FinishTimeParams.model_validate(params), ledger())
    scorer.clock = lambda: NOW
    return scorer


def completion(max_tokens: int, model: str = "m", prompt_tokens: int = 100) -> object:
    body = {"prompt": "x" * (4 * prompt_tokens), "max_tokens": max_tokens}
    return req("completions", body, model=model)


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


def test_before_any_pace_the_nominal_engine_prices_each_pod() -> None:
    scorer = make()
    a, b = ep("a"), ep("b")
    running(scorer, a, 1000)
    got = scorer.score(CycleState(), completion(10), [a, b])  # type: ignore[arg-type]
    # a's stream shares every step with the request: a little slower than idle b
    assert got["b"] == 1.0
    assert 0.95 < got["a"] < 1.0


def test_a_full_pod_whose_requests_end_soon_beats_one_whose_requests_just_began() -> None:
    scorer = make()
    soon, late = ep("soon"), ep("late")
    for pod in (soon, late):
        teach_pace(scorer, pod, 0.01)
    learn_depth(scorer, [soon, late])
    # both full (two slots), the same request count; soon's first ends within 10 tokens
    running(scorer, soon, 1000, streamed=990)
    running(scorer, soon, 1000, streamed=950)
    running(scorer, late, 1000, streamed=10)
    running(scorer, late, 1000, streamed=20)
    got = scorer.score(CycleState(), completion(100), [soon, late])  # type: ignore[arg-type]
    assert got["soon"] == 1.0
    # a slot frees on soon after 10 steps, on late after 980: the replays, by hand
    pace = scorer.load.pace("soon")
    v = speed(scorer, pace)
    assert v is not None and scorer.queue.slots("soon") == 2
    costs, own = scorer.costs.scaled(v), Job(100, 0, 100)
    t_soon = finish_seconds([Job(0, 990, 10), Job(0, 950, 50)], [], own, costs, 2)
    t_late = finish_seconds([Job(0, 10, 990), Job(0, 20, 980)], [], own, costs, 2)
    assert t_late > 5 * t_soon
    assert got["late"] == pytest.approx(t_soon / t_late)


def test_before_a_pod_is_seen_to_queue_everything_on_it_runs_at_once() -> None:
    scorer = make()
    a, b = ep("a"), ep("b")
    for pod in (a, b):
        teach_pace(scorer, pod, 0.01)
    running(scorer, a, 1000)
    running(scorer, a, 1000)
    got = scorer.score(CycleState(), completion(100), [a, b])  # type: ignore[arg-type]
    # no wait for a slot on a: only its steps are a little longer with three decoding
    assert got["b"] == 1.0 and 0.9 < got["a"] < 1.0


def test_a_pod_learns_its_speed_from_its_pace_and_the_batch_it_was_seen_at() -> None:
    scorer = make()
    fast, slow, new = ep("fast"), ep("slow"), ep("new")
    teach_pace(scorer, fast, 0.01)
    teach_pace(scorer, slow, 0.02)
    load = scorer.load
    v_fast, v_slow = speed(scorer, load.pace("fast")), speed(scorer, load.pace("slow"))
    assert v_fast is not None and v_slow is not None
    # one stream alone on the pod, of 100 prompt tokens and 5 out: the nominal step with one
    # decoder reading its context (the prompt and half the output) is 8.15 ms + 102.5 * 60 ns
    pace = load.pace("fast")
    assert pace is not None and pace.context == pytest.approx(102.5)
    assert v_fast == pytest.approx(0.01 / (0.00815 + 102.5 * 6e-8))
    assert v_slow == pytest.approx(2 * v_fast)
    request = completion(100)
    got = scorer.score(CycleState(), request, [fast, slow, new])  # type: ignore[arg-type]
    job = Job(100, 0, 100)
    alone = {v: alone_seconds(scorer.costs.scaled(v), job) for v in (v_fast, v_slow)}
    assert got["fast"] == 1.0
    assert got["slow"] == pytest.approx(alone[v_fast] / alone[v_slow])
    # a pod with no stream of its own yet runs at the fleet's mean speed
    mean = alone_seconds(scorer.costs.scaled((v_fast + v_slow) / 2), job)
    assert got["new"] == pytest.approx(alone[v_fast] / mean)


def test_the_prefills_between_a_streams_tokens_are_not_read_as_a_slow_pod() -> None:
    scorer = make()
    a = ep("a")
    load = scorer.load
    s = ctx(completion(11), a)  # type: ignore[arg-type]
    s.key = "s"
    load.acquire("s", "a", prompt=100, whole=100, now=NOW, ctx=s)
    s.chunk_arrived(1, NOW + 0.1)
    load.prompt_done("s", NOW + 0.1)
    other = ctx(completion(1), a)  # type: ignore[arg-type]
    other.key = "o"
    load.acquire("o", "a", prompt=4000, now=NOW + 0.1, ctx=other)
    load.prompt_done("o", NOW + 0.2)  # 4,000 prompt tokens prefilled among s's tokens
    load.release("o")
    s.chunk_arrived(10, NOW + 0.1 + 10 * 0.01 + 4000 / 16000)
    load.release("s")
    pace = load.pace("a")
    assert pace is not None and pace.prefill_per_token == pytest.approx(400.0)
    # 35 ms a token, of which 25 ms is the prefill: the pod runs at its nominal speed's 1.05x
    # (the stream read a context of its 100 prompt tokens and half its 11 output tokens)
    assert pace.context == pytest.approx(105.5)
    assert speed(scorer, pace) == pytest.approx(0.035 / (0.00815 + 105.5 * 6e-8 + 0.025))


def test_the_prompt_a_pod_holds_is_not_prefilled_again() -> None:
    scorer = make()
    warm, cold = ep("warm"), ep("cold")
    for pod in (warm, cold):
        teach_pace(scorer, pod, 0.00815)  # nominal speed
    state = CycleState()
    key = prefix_match_key("approx-prefix-cache-producer", "approx-prefix-cache-producer")
    state[key] = PrefixCacheMatchInfo(16, 100, 1600, {"warm": 100.0})
    got = scorer.score(state, completion(10, prompt_tokens=1600), [warm, cold])  # type: ignore[arg-type]
    costs = scorer.costs
    warm_s = alone_seconds(costs, Job(1, 1599, 10))
    cold_s = alone_seconds(costs, Job(1600, 0, 10))
    assert got["warm"] == 1.0
    assert got["cold"] == pytest.approx(warm_s / cold_s)


def test_a_lora_request_waits_where_another_adapter_fills_the_adapter_slot() -> None:
    scorer = make()
    busy = ep("busy", lora_running=("lora-a",), max_lora=1)
    free = ep("free", lora_running=("lora-b",), max_lora=1)
    for pod in (busy, free):
        teach_pace(scorer, pod, 0.00815)
    running(scorer, busy, 500, model="lora-a")  # 499 steps before its adapter slot frees
    running(scorer, free, 500, model="lora-b")
    got = scorer.score(CycleState(), completion(100, "lora-b"), [busy, free])  # type: ignore[arg-type]
    assert got["free"] == 1.0
    # busy: about 4 s of lora-a's stream, then lora-b's load (0.2 s), then its own ~0.8 s
    assert got["busy"] == pytest.approx(0.85 / (4.1 + 0.2 + 0.85), rel=0.05)
    # a base-model request takes no adapter slot: both pods alike
    got = scorer.score(CycleState(), completion(100), [busy, free])  # type: ignore[arg-type]
    assert got["busy"] == pytest.approx(got["free"])


def test_the_adapter_that_last_ran_on_an_idle_pod_is_taken_as_resident() -> None:
    scorer = make()
    holds, other = (ep(n, max_lora=1) for n in ("holds", "other"))
    # a third pod's metrics name both adapters (this gateway knows them as adapters)
    third = ep("third", lora_running=("lora-a",), lora_waiting=("lora-b",), max_lora=1)
    for pod, model in ((holds, "lora-b"), (other, "lora-a")):
        c = ctx(completion(2, model), pod)  # type: ignore[arg-type]
        scorer.load.acquire(c.key, pod.name, now=NOW, ctx=c)
        c.chunk_arrived(1, NOW + 0.1)
        scorer.load.prompt_done(c.key, NOW + 0.1)  # it ran: its adapter was loaded
        scorer.load.release(c.key)
    # sent, never run (still queued when the pod dropped it): not taken as loaded
    c = ctx(completion(2, "lora-a"), holds)  # type: ignore[arg-type]
    scorer.load.acquire(c.key, "holds", now=NOW, ctx=c)
    scorer.load.release(c.key)
    request = completion(10, "lora-b")
    got = scorer.score(CycleState(), request, [holds, other, third])  # type: ignore[arg-type]
    costs = scorer.costs
    job = Job(100, 0, 10, "lora-b")
    assert got["holds"] == 1.0
    assert got["other"] == pytest.approx(
        alone_seconds(costs, job) / alone_seconds(costs, job, load=True)
    )


@pytest.mark.parametrize("streaming", [True, False])
def test_a_prefill_under_way_counts_with_the_time_it_has_left(streaming: bool) -> None:
    """The replay starts at the pod's last chunk (a stream there), or with nothing streaming
    at its oldest attempt's send: both at NOW here."""
    scorer = make()
    a, b = ep("a"), ep("b")
    if streaming:
        running(scorer, a, 1000, streamed=1)  # its last chunk at NOW
    long_prompt = ctx(completion(1, prompt_tokens=1), a)  # type: ignore[arg-type]
    long_prompt.key = "long"
    scorer.load.acquire("long", "a", prompt=8000, whole=8000, now=NOW, ctx=long_prompt)
    request = completion(10)
    early = scorer.score(CycleState(), request, [a, b])["a"]  # type: ignore[arg-type]
    scorer.clock = lambda: NOW + 0.3  # 0.3 s of its 0.5 s prefill gone
    late = scorer.score(CycleState(), request, [a, b])["a"]  # type: ignore[arg-type]
    assert early < late < 1.0
    own = alone_seconds(scorer.costs, Job(100, 0, 10))
    # score = the best finish (idle b's) over a's: a's finish came 0.3 s nearer
    assert own / late == pytest.approx(own / early - 0.3, abs=0.02)


def test_a_request_not_streamed_is_counted_down_by_its_age_at_the_pods_pace() -> None:
    scorer = make()
    a, b = ep("a"), ep("b")
    for pod in (a, b):
        teach_pace(scorer, pod, 0.01)  # first chunk after 0.1 s, then 10 ms a token
    learn_depth(scorer, [a, b])
    for pod in (a, b):
        running(scorer, pod, 1000, streamed=100)  # a slot held for 900 steps on each
    plain = ctx(completion(1000), a)  # type: ignore[arg-type]
    scorer.load.acquire("plain", "a", now=NOW, ctx=plain)  # a's other slot: 1000 tokens, no stream
    running(scorer, b, 200, streamed=0)  # b's other slot: 200 steps
    request = completion(10)
    scorer.clock = lambda: NOW + 0.1  # nothing out yet by the pace: 1000 steps left on a
    got = scorer.score(CycleState(), request, [a, b])  # type: ignore[arg-type]
    assert got["b"] == 1.0 and got["a"] < 0.5
    scorer.clock = lambda: NOW + 9.1  # 900 tokens out by now: 100 steps, sooner than b's 200
    got = scorer.score(CycleState(), request, [a, b])  # type: ignore[arg-type]
    assert got["a"] == 1.0 and got["b"] == pytest.approx(0.5, rel=0.1)


def test_before_the_depth_is_learned_a_pod_seen_queueing_runs_what_it_ran_then() -> None:
    scorer = make()
    full = ep("full", running=2, waiting=1)  # its scrapes: two running, one waiting
    roomy = ep("roomy", running=3, waiting=0)  # more running than full's slots: not alike
    for pod in (full, roomy):
        running(scorer, pod, 1000, streamed=10)
        running(scorer, pod, 1000, streamed=20)
        for _ in range(2):
            scorer.load.scraped(pod.name, pod.metrics)
    got = scorer.score(CycleState(), completion(10), [full, roomy])  # type: ignore[arg-type]
    assert scorer.queue.slots("full") == 2 and scorer.queue.slots("roomy") is None
    # on full the request waits for a slot (about 980 steps); on roomy it starts at once
    assert got["roomy"] == 1.0 and got["full"] < 0.1
