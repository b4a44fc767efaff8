"""edf-ordering-policy: the queue-wait deadline as the key; requests without one after all
that have one, in arrival order."""

from __future__ import annotations

import asyncio

from heimdall_proxy.config.flow import PriorityBandConfig
from heimdall_proxy.flowcontrol.queues import Band, Queued
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.plugins.flowcontrol.edf import EDFOrdering
from heimdall_proxy.plugins.flowcontrol.global_strict import GlobalStrictFairness
from tests.flowcontrol.harness import controller, hold, release_order, request
from tests.plugins.helpers import ledger


def test_the_key_is_the_deadline() -> None:
    policy = EDFOrdering("edf", NoParams(), ledger())
    assert policy.order_key(1.0, 61.0, request()) == 61.0
    assert policy.order_key(1.0, float("inf"), request()) == float("inf")


async def test_with_one_budget_for_all_it_keeps_arrival_order() -> None:
    # every request gets defaultRequestTTL: deadlines follow arrivals
    fc = controller({"defaultRequestTTL": "30s"}, ordering=EDFOrdering("e", NoParams(), ledger()))
    hold(fc, 1)
    labelled = [(x, request()) for x in ("a", "b", "c")]
    assert await release_order(fc, labelled, held=1) == ["a", "b", "c"]


async def test_without_a_budget_requests_keep_arrival_order() -> None:
    # defaultRequestTTL 0: no deadline at all, so all tie at inf and FCFS breaks the tie
    fc = controller({"defaultRequestTTL": 0}, ordering=EDFOrdering("e", NoParams(), ledger()))
    hold(fc, 1)
    labelled = [(x, request()) for x in ("a", "b", "c")]
    assert await release_order(fc, labelled, held=1) == ["a", "b", "c"]


async def test_a_band_serves_the_earliest_deadline_first() -> None:
    # deadlines that differ from arrival order (a request queued while it had no candidate
    # runs on noEndpointRequestTTL); no deadline sorts last
    handle = ledger()
    band = Band(
        PriorityBandConfig(),
        GlobalStrictFairness("gs", NoParams(), handle),
        EDFOrdering("e", NoParams(), handle),
    )
    loop = asyncio.get_running_loop()
    items = {}
    for label, arrival, deadline in [
        ("late", 1.0, 61.0),
        ("never", 2.0, float("inf")),
        ("soon", 3.0, 13.0),
        ("tie-first", 4.0, 30.0),
        ("tie-second", 5.0, 30.0),
    ]:
        items[label] = Queued(request(), [], 2, arrival, deadline, loop.create_future())
        band.push(items[label])
    served = []
    while band.count:
        ((_, head, _),) = band.heads()
        served.append(next(k for k, v in items.items() if v is head))
        band.remove(head)
    assert served == ["soon", "tie-first", "tie-second", "late", "never"]
