"""outstanding-work-scorer's slot wait: with every slot of a pod busy, the pod whose first
slot frees soonest is the least loaded, whatever its total work."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scorers.outstanding_work import (
    OutstandingWorkParams,
    OutstandingWorkScorer,
)
from heimdall_proxy.plugins.scorers.slot_wait import SlotCapacity, start_delay
from tests.helpers import ep
from tests.plugins.helpers import ctx, req


def test_start_delay_is_zero_with_a_free_slot() -> None:
    assert start_delay([], 2) == 0.0
    assert start_delay([50.0], 2) == 0.0
    assert start_delay([50.0, 70.0], 0) == 0.0


def test_start_delay_is_the_first_slot_to_free_after_the_queue() -> None:
    assert start_delay([10.0, 100.0], 2) == 10.0
    assert start_delay([60.0, 60.0], 2) == 60.0
    # slots free at 10 and 100; the queued 30 takes the first (10 -> 40): next free at 40
    assert start_delay([10.0, 100.0, 30.0], 2) == 40.0
    # then a queued 80 takes the slot freeing at 40 (-> 120): next free at 100
    assert start_delay([10.0, 100.0, 30.0, 80.0], 2) == 100.0
    assert start_delay([5.0, 7.0, 9.0], 1) == 21.0


def test_capacity_is_unknown_until_the_pod_is_seen_full() -> None:
    cap = SlotCapacity()
    cap.observe("p", running=5, waiting=0)
    assert cap.slots("p") is None
    cap.observe("p", running=3, waiting=2)  # a burst being admitted: not smaller than seen
    assert cap.slots("p") == 5
    cap.observe("p", running=8, waiting=0)
    assert cap.slots("p") == 8
    assert cap.learned() == [("p", 8)]
    cap.forget("p")
    assert cap.slots("p") is None


def completion(max_tokens: int) -> object:
    return req("completions", {"prompt": "x", "max_tokens": max_tokens})


async def _load(scorer: OutstandingWorkScorer, pod: object, replies: list[int]) -> None:
    for n in replies:
        c = ctx(completion(n), pod)  # type: ignore[arg-type]
        await scorer.pre_request(c)
        await scorer.response_received(c)  # prefill done: only the reply is left


@pytest.mark.parametrize("slot_wait", [True, False])
async def test_full_pods_rank_by_when_a_slot_frees(slot_wait: bool) -> None:
    scorer = OutstandingWorkScorer(
        "w",
        OutstandingWorkParams.model_validate({"slotWait": slot_wait}),
        None,  # type: ignore[arg-type]
    )
    # both pods were seen running two requests with one waiting: two slots each
    soon = ep("soon", running=2, waiting=1, updated_at=1.0)
    late = ep("late", running=2, waiting=1, updated_at=1.0)
    await _load(scorer, soon, [10, 120])  # a slot frees after 10 tokens; 130 in all
    await _load(scorer, late, [60, 60])  # after 60; 120 in all
    assert scorer.work("soon") > scorer.work("late")
    got = scorer.score(CycleState(), req(), [soon, late])
    if slot_wait:
        # loads 130 + 2 x 10 = 150 and 120 + 2 x 60 = 240
        assert got["soon"] == pytest.approx(1 - 150 / 240)
        assert got["late"] == 0.0
    else:
        assert got["late"] == pytest.approx(1 - 120 / 130)
        assert got["soon"] == 0.0


async def test_a_pod_never_seen_full_or_with_a_free_slot_keeps_its_work() -> None:
    scorer = OutstandingWorkScorer("w", OutstandingWorkParams(), None)  # type: ignore[arg-type]
    never_full = ep("a", running=2, waiting=0, updated_at=1.0)
    free_slot = ep("b", running=3, waiting=4, updated_at=1.0)  # three slots
    await _load(scorer, never_full, [10, 120])
    await _load(scorer, free_slot, [60, 60])
    assert scorer.slot_waits() == {}
    got = scorer.score(CycleState(), req(), [never_full, free_slot])
    assert got == {"a": 0.0, "b": pytest.approx(1 - 120 / 130)}
