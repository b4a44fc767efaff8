"""The flow controller asking a usage-limit policy: a band goes only while the pool's
saturation is below its ceiling, on admission and on every dispatch decision.

The pool is one pod under a concurrency-detector with maxConcurrency 10, so n requests in
flight are saturation n / 10. Bands 10 (gold), 0 and -1 (batch) are configured, so all
three are active from the start, as in llm-d."""

from __future__ import annotations

import asyncio

import pytest

from heimdall_proxy.flowcontrol.controller import FlowController
from heimdall_proxy.framework.flowcontrol import UsageLimitPolicy
from heimdall_proxy.plugins.flowcontrol.usage_limits.priority_holdback import (
    PriorityHoldback,
    PriorityHoldbackParams,
)
from heimdall_proxy.plugins.flowcontrol.usage_limits.soft_reflective_ceiling import (
    SoftReflectiveCeiling,
    SoftReflectiveCeilingParams,
)
from heimdall_proxy.plugins.flowcontrol.usage_limits.static import (
    StaticUsageLimit,
    StaticUsageLimitParams,
)
from tests.flowcontrol.harness import POD, controller, hold, let_go, queued, request
from tests.plugins.helpers import ledger

BANDS = {"priorityBands": [{"priority": 10}, {"priority": 0}, {"priority": -1}]}


def make(policy: UsageLimitPolicy) -> FlowController:
    return controller(BANDS, usage_limit=policy, max_concurrency=10)


async def at_once(fc: FlowController, objective: str) -> bool:
    """Whether a request of `objective` is let through without waiting (then it leaves
    again, so the saturation stays where the test put it)."""
    task = asyncio.create_task(fc.admit(request(objective), [POD]))
    await asyncio.sleep(0.001)
    if task.done():
        task.result().finish()
        return True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await queued(fc, 0)
    return False


async def test_priority_holdback_holds_the_lowest_priority_first() -> None:
    # rank domain, 0.4 to 1.0 over three bands: ceilings 1.0 (gold), 0.7 (0), 0.4 (batch)
    policy = PriorityHoldback("h", PriorityHoldbackParams(minCeiling=0.4), ledger())
    fc = make(policy)
    assert fc.usage_limit is policy
    expected = {
        3: {"gold": True, "": True, "batch": True},
        5: {"gold": True, "": True, "batch": False},
        8: {"gold": True, "": False, "batch": False},
    }
    for inflight, want in expected.items():
        hold(fc, inflight)
        for objective, goes in want.items():
            assert await at_once(fc, objective) is goes, (inflight, objective)
        let_go(fc, inflight)


async def test_held_requests_go_as_the_pool_drains_highest_band_first() -> None:
    fc = make(PriorityHoldback("h", PriorityHoldbackParams(minCeiling=0.4), ledger()))
    hold(fc, 9)
    order: list[str] = []

    async def one(objective: str) -> None:
        admission = await fc.admit(request(objective), [POD])
        order.append(objective or "default")
        admission.finish()

    tasks = [asyncio.create_task(one(o)) for o in ("batch", "")]
    await queued(fc, 2)
    let_go(fc, 9)
    hold(fc, 6)  # 0.6: the default band (0.7) may go, batch (0.4) still waits
    await asyncio.sleep(0.1)
    assert order == ["default"] and fc.queued == 1
    let_go(fc, 6)
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == ["default", "batch"]


async def test_a_static_threshold_keeps_headroom_for_everyone() -> None:
    fc = make(StaticUsageLimit("s", StaticUsageLimitParams(threshold=0.8), ledger()))
    hold(fc, 7)
    assert await at_once(fc, "gold") and await at_once(fc, "batch")
    let_go(fc, 7)
    hold(fc, 8)
    assert not await at_once(fc, "gold")


@pytest.mark.slow
async def test_the_soft_ceiling_throttles_a_lower_band_instead_of_shutting_it() -> None:
    # three bands at saturation 0.9: reflective ceilings 1.0, 0.55, 0.1, so bands 0 and -1
    # are past theirs; they open together on one decision in round(0.9 / 0.1) = 9
    fc = make(SoftReflectiveCeiling("sr", SoftReflectiveCeilingParams(), ledger()))
    hold(fc, 9)
    assert await at_once(fc, "gold")
    waiting = asyncio.create_task(fc.admit(request("batch"), [POD]))
    await queued(fc, 1)  # its first decision was a closed one
    # the dispatcher's later decisions open the band, saturation still 0.9
    admission = await asyncio.wait_for(waiting, 3)
    assert admission.waited
    admission.finish()
    # a hard ceiling below 0.9 keeps it for as long as the saturation stays
    fc2 = make(PriorityHoldback("h", PriorityHoldbackParams(minCeiling=0.4), ledger()))
    hold(fc2, 9)
    held = asyncio.create_task(fc2.admit(request("batch"), [POD]))
    await asyncio.sleep(0.3)
    assert not held.done()
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)


async def test_the_soft_ceiling_opens_below_the_reflection_and_shuts_at_saturation() -> None:
    fc = make(SoftReflectiveCeiling("sr", SoftReflectiveCeilingParams(), ledger()))
    # 0.2 is below every reflective ceiling (the lowest is 1 - 0.2): all go at once, always
    hold(fc, 2)
    assert all([await at_once(fc, "batch") for _ in range(4)])
    let_go(fc, 2)
    # at saturation 1.0 even the highest band's ceiling (1.0) is reached: nothing goes
    hold(fc, 10)
    assert not await at_once(fc, "gold") and not await at_once(fc, "batch")


async def test_without_a_policy_every_band_fills_to_saturation() -> None:
    fc = controller(BANDS, max_concurrency=10)
    assert fc.usage_limit is None
    hold(fc, 9)
    assert await at_once(fc, "batch")
