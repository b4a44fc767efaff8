"""The finish-time replay: when a request sent to a pod now would start and finish."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.finish_time import Ahead, finish_time, start_time


def base(*lefts: float) -> list[Ahead]:
    return [Ahead(left, "") for left in lefts]


def test_a_pod_with_a_free_slot_or_no_known_limit_starts_it_at_once() -> None:
    assert start_time(base(3.0), slots=2) == 0.0
    assert start_time(base(3.0, 1.0, 5.0), slots=None) == 0.0
    assert start_time([], slots=1) == 0.0


def test_the_slot_that_frees_first_is_the_request_with_least_left() -> None:
    # two running, 3 s and 1 s left: the new one starts in 1 s, whatever their order
    assert start_time(base(3.0, 1.0), slots=2) == pytest.approx(1.0)
    assert start_time(base(1.0, 3.0), slots=2) == pytest.approx(1.0)
    # a queued 2 s request takes the first slot (at 1 s, to 3 s): the next frees at 3 s
    assert start_time(base(3.0, 1.0, 2.0), slots=2) == pytest.approx(3.0)
    assert finish_time(base(3.0, 1.0, 2.0), own=0.5, slots=2) == pytest.approx(3.5)


def test_requests_beyond_the_slots_queue_in_the_order_they_came() -> None:
    # one slot: everything ahead runs in turn
    assert start_time(base(1.0, 2.0, 4.0), slots=1) == pytest.approx(7.0)


def test_an_adapter_waits_for_other_adapters_that_fill_the_adapter_slots() -> None:
    running = [Ahead(5.0, "lora-a"), Ahead(1.0, "")]
    # a free request slot, but the one adapter slot holds lora-a until its request ends
    assert start_time(running, slots=3, adapter="lora-b", max_adapters=1) == pytest.approx(5.0)
    # its own adapter is resident, or there is room for a second one: no wait
    assert start_time(running, slots=3, adapter="lora-a", max_adapters=1) == 0.0
    assert start_time(running, slots=3, adapter="lora-b", max_adapters=2) == 0.0
    # a base-model request takes no adapter slot; an unknown slot count is not looked at
    assert start_time(running, slots=3, adapter="", max_adapters=1) == 0.0
    assert start_time(running, slots=3, adapter="lora-b", max_adapters=0) == 0.0


def test_with_two_other_adapters_and_one_slot_both_must_end() -> None:
    running = [Ahead(2.0, "lora-a"), Ahead(6.0, "lora-c"), Ahead(4.0, "lora-a")]
    # lora-a holds until 4 s, lora-c until 6 s; one slot needs both gone, two slots one
    assert start_time(running, slots=None, adapter="b", max_adapters=1) == pytest.approx(6.0)
    assert start_time(running, slots=None, adapter="b", max_adapters=2) == pytest.approx(4.0)


def test_the_adapter_wait_and_the_slot_wait_do_not_add_up() -> None:
    # the slot frees at 1 s, the adapter slot at 5 s: it starts at 5 s, not 6 s
    running = [Ahead(5.0, "lora-a"), Ahead(1.0, "")]
    assert start_time(running, slots=2, adapter="lora-b", max_adapters=1) == pytest.approx(5.0)
