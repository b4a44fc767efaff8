"""The engine model's replay: when a request sent to a pod would finish, step by step."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.engine_model import Job, StepCosts, alone_seconds, finish_seconds

#: Round numbers, no context cost: each case can be worked out by hand.
C = StepCosts(
    step=0.01,
    per_seq=0.001,
    per_prefill_token=0.0001,
    per_context_token=0.0,
    budget=1000,
    lora_load=0.5,
)


def test_alone_a_prompt_in_chunks_of_the_budget_then_a_token_a_step() -> None:
    job = Job(prefill=2500, context=0, output=11)
    # three chunks (1000, 1000, 500): 3 steps + 2500 tokens; the last yields the first token;
    # 10 more tokens, one decoding step each
    want = 3 * 0.01 + 2500 * 0.0001 + 10 * (0.01 + 0.001)
    assert alone_seconds(C, job) == pytest.approx(want)
    assert finish_seconds([], [], job, C, slots=None) == pytest.approx(want)
    assert alone_seconds(C, job, load=True) == pytest.approx(want + 0.5)


def test_the_context_decoders_read_costs_per_step() -> None:
    c = StepCosts(step=0.01, per_seq=0.0, per_prefill_token=0.0, per_context_token=0.001)
    job = Job(prefill=1, context=9, output=3)
    # prefill step (no decoder), then 2 steps reading 10 and 11 tokens of context
    want = 0.01 + (0.01 + 0.010) + (0.01 + 0.011)
    assert alone_seconds(c, job) == pytest.approx(want)
    assert finish_seconds([], [], job, c, slots=None) == pytest.approx(want)


def test_a_full_pod_starts_the_request_when_its_shortest_stream_ends() -> None:
    running = [Job(0, 100, 50), Job(0, 100, 5)]
    own = Job(prefill=10, context=0, output=1)
    # 5 steps of two decoders; then a step prefilling 10 tokens beside the other decoder,
    # which yields the request's only token
    want = 5 * (0.01 + 2 * 0.001) + (0.01 + 10 * 0.0001 + 0.001)
    assert finish_seconds(running, [], own, C, slots=2) == pytest.approx(want)
    # with a slot free it starts at the first step, beside both
    assert finish_seconds(running, [], own, C, slots=3) == pytest.approx(
        0.01 + 10 * 0.0001 + 2 * 0.001
    )


def test_a_long_prompt_admitted_ahead_slows_every_step_it_shares() -> None:
    own = Job(prefill=10, context=0, output=3)
    quiet = finish_seconds([], [], own, C, slots=None)
    behind_long = finish_seconds([], [Job(3000, 0, 1)], own, C, slots=None)
    # the long prompt takes the first three steps' budget: the request starts at the fourth
    assert behind_long == pytest.approx(3 * 0.01 + 3000 * 0.0001 + quiet)


def test_sent_after_the_last_step_seen_the_prefill_under_way_has_less_left() -> None:
    long_prompt = [Job(1000, 0, 1)]  # one step of 0.11 s, begun when the last chunk came
    own = Job(prefill=10, context=0, output=1)
    at_once = finish_seconds([], long_prompt, own, C, slots=None)
    later = finish_seconds([], long_prompt, own, C, slots=None, own_at=0.1)
    # the long prompt fills the first step's budget: the request goes in the second
    assert at_once == pytest.approx(0.11 + 0.01 + 10 * 0.0001)
    # sent 0.1 s into that step: 0.01 s before the second
    assert later == pytest.approx(0.11 - 0.1 + 0.01 + 10 * 0.0001)
    # sent after the pod went idle: its own time alone
    assert finish_seconds([], long_prompt, own, C, None, own_at=5.0) == pytest.approx(
        alone_seconds(C, own)
    )


def test_a_decode_span_stops_where_a_request_sent_meanwhile_may_join() -> None:
    running = [Job(0, 0, 100)]
    own = Job(prefill=1, context=0, output=1)
    step = 0.01 + 0.001
    # sent 2.5 steps in: it joins the fourth step (the third ends after it was sent)
    got = finish_seconds(running, [], own, C, slots=None, own_at=2.5 * step)
    assert got == pytest.approx(0.5 * step + (0.01 + 0.0001 + 0.001))


def test_a_lora_request_waits_for_the_adapter_slot_then_loads_its_adapter() -> None:
    running = [Job(0, 0, 20, "a")]
    own = Job(prefill=10, context=0, output=1, adapter="b")
    got = finish_seconds(running, [], own, C, slots=None, max_adapters=1, resident=["a"])
    # 20 steps of a's stream, then b's load and prefill
    assert got == pytest.approx(20 * 0.011 + 0.5 + 0.01 + 10 * 0.0001)
    # resident: no wait and no load
    got = finish_seconds(running, [], own, C, None, max_adapters=1, resident=["a", "b"])
    assert got == pytest.approx(0.01 + 10 * 0.0001 + 0.001)
    # two adapter slots: a free one, a load
    got = finish_seconds(running, [], own, C, None, max_adapters=2, resident=["a"])
    assert got == pytest.approx(0.5 + 0.01 + 10 * 0.0001 + 0.001)
    # unknown adapter slots: the rule is not applied
    got = finish_seconds(running, [], own, C, None, max_adapters=0, resident=["a"])
    assert got == pytest.approx(0.01 + 10 * 0.0001 + 0.001)


def test_requests_behind_a_blocked_adapter_go_first() -> None:
    running = [Job(0, 0, 10, "a")]
    blocked = Job(10, 0, 1, "b")
    own = Job(prefill=10, context=0, output=1)
    got = finish_seconds(running, [blocked], own, C, None, max_adapters=1, resident=["a"])
    assert got == pytest.approx(0.01 + 10 * 0.0001 + 0.001)


def test_a_slower_pod_scales_its_steps_not_its_adapter_loads() -> None:
    slow = C.scaled(2.0)
    assert (slow.step, slow.per_seq, slow.per_prefill_token) == (0.02, 0.002, 0.0002)
    assert slow.lora_load == C.lora_load and slow.budget == C.budget
    assert C.scaled(1.0) is C
