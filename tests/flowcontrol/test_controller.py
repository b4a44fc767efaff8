"""The flow controller on its own: admission, queues, priority, fairness, budgets, hang-ups.

Real detectors (concurrency-detector, whose only input is the in-flight ledger the tests
drive as the relay would) and real asyncio waiting; no pod is needed below the controller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.flowcontrol.controller import Admission, FlowController
from heimdall_proxy.flowcontrol.objectives import Objectives
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.flowcontrol import FairnessPolicy
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import Endpoint, InferenceRequest
from heimdall_proxy.plugins.flowcontrol.round_robin import RoundRobinFairness
from tests.flowcontrol.harness import OBJECTIVES, POD, controller
from tests.helpers import ep


def make(
    flow: dict[str, Any] | None = None,
    *,
    queues: bool = True,
    fairness: str = "global-strict",
    max_concurrency: int = 1,
) -> FlowController:
    policy: FairnessPolicy | None = None
    if fairness == "round-robin":
        policy = RoundRobinFairness("rr", NoParams(), PluginHandle(EndpointPool([])))
    return controller(flow, fairness=policy, max_concurrency=max_concurrency, queues=queues)


def req(
    objective: str = "", flow: str = "", body: bytes = b"{}", model: str = "m"
) -> InferenceRequest:
    headers = {}
    if objective:
        headers["x-gateway-inference-objective"] = objective
    if flow:
        headers["x-gateway-inference-fairness-id"] = flow
    return InferenceRequest("completions", "/v1/completions", model, body, {}, headers)


def occupy(fc: FlowController, admission: Admission, pod: Endpoint = POD) -> None:
    """What the relay does when the request's attempt starts."""
    admission.sent()
    fc.load.acquire(f"{id(admission)}:0", pod.name, 1)


def done(fc: FlowController, admission: Admission, pod: Endpoint = POD) -> None:
    """What the relay and the gateway do when it ends."""
    fc.load.release(f"{id(admission)}:0")
    admission.finish()


async def started(fc: FlowController, n: int) -> None:
    for _ in range(200):
        if fc.queued == n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"queued {fc.queued}, want {n}")


async def test_room_admits_at_once_and_counts_pending_until_sent() -> None:
    fc = make()
    a = await fc.admit(req(), [POD])
    assert not a.waited and fc.load.pending == 1
    occupy(fc, a)
    assert fc.load.pending == 0 and fc.load.requests == {"pod-a": 1}
    done(fc, a)
    assert fc.load.requests == {} and fc.load.pending == 0


async def test_a_saturated_pool_queues_until_a_request_finishes() -> None:
    fc = make()
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    waiting = asyncio.create_task(fc.admit(req(), [POD]))
    await started(fc, 1)
    assert not waiting.done()
    done(fc, first)
    second = await asyncio.wait_for(waiting, 2)
    assert second.waited and fc.queued == 0 and fc.load.pending == 1
    occupy(fc, second)
    done(fc, second)
    assert fc.load.pending == 0 and fc.load.requests == {}


async def test_higher_priority_goes_first_and_flows_take_turns() -> None:
    fc = make(fairness="round-robin")
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    order: list[str] = []

    async def one(label: str, objective: str = "", flow: str = "") -> None:
        admission = await fc.admit(req(objective, flow), [POD])
        order.append(label)
        occupy(fc, admission)
        await asyncio.sleep(0)
        done(fc, admission)

    tasks = []
    for label, objective, flow in [
        ("a1", "", "a"),
        ("a2", "", "a"),
        ("a3", "", "a"),
        ("b1", "", "b"),
        ("gold", "gold", "a"),
    ]:
        tasks.append(asyncio.create_task(one(label, objective, flow)))
        await started(fc, len(tasks))
    done(fc, first)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["gold", "a1", "b1", "a2", "a3"]


async def test_global_strict_keeps_arrival_order_across_flows() -> None:
    fc = make()
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    order: list[str] = []

    async def one(label: str, flow: str) -> None:
        admission = await fc.admit(req(flow=flow), [POD])
        order.append(label)
        occupy(fc, admission)
        await asyncio.sleep(0)
        done(fc, admission)

    tasks = []
    for label, flow in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        tasks.append(asyncio.create_task(one(label, flow)))
        await started(fc, len(tasks))
    done(fc, first)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["a1", "a2", "b1"]


async def test_a_request_that_waits_out_its_budget_gets_a_429() -> None:
    fc = make({"defaultRequestTTL": "50ms"})
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    with pytest.raises(RequestError) as err:
        await fc.admit(req(), [POD])
    assert err.value.status == 429 and err.value.code == "queue_timeout"
    assert err.value.headers["Retry-After"] == "1"
    assert fc.queued == 0 and fc.queued_bytes == 0 and fc.load.pending == 0
    done(fc, first)


async def test_no_candidate_waits_the_no_endpoint_budget_then_503() -> None:
    fc = make({"noEndpointRequestTTL": "30ms", "defaultRequestTTL": "10s"})
    with pytest.raises(RequestError) as err:
        await fc.admit(req(), [])
    assert err.value.status == 503
    assert fc.queued == 0


async def test_a_client_that_hangs_up_leaves_the_queue() -> None:
    fc = make()
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    waiting = asyncio.create_task(fc.admit(req(body=b"x" * 100), [POD]))
    await started(fc, 1)
    assert fc.queued_bytes == 100
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert fc.queued == 0 and fc.queued_bytes == 0
    done(fc, first)
    assert fc.load.pending == 0


async def test_sheddable_requests_are_shed_when_saturated() -> None:
    fc = make()
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    with pytest.raises(RequestError) as err:
        await fc.admit(req("batch"), [POD])
    assert err.value.status == 429 and err.value.code == "pool_saturated"
    assert fc.queued == 0
    done(fc, first)
    again = await fc.admit(req("batch"), [POD])  # room again: sheddable goes through
    assert not again.waited


async def test_sheddable_requests_queue_in_a_configured_negative_band() -> None:
    fc = make({"priorityBands": [{"priority": -1, "maxRequests": 1}]})
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    waiting = asyncio.create_task(fc.admit(req("batch"), [POD]))
    await started(fc, 1)
    with pytest.raises(RequestError) as err:  # the band holds one
        await fc.admit(req("batch"), [POD])
    assert err.value.code == "queue_full"
    done(fc, first)
    assert (await asyncio.wait_for(waiting, 2)).waited


async def test_global_byte_bound() -> None:
    fc = make({"maxBytes": "150"})
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    waiting = asyncio.create_task(fc.admit(req(body=b"x" * 100), [POD]))
    await started(fc, 1)
    with pytest.raises(RequestError) as err:
        await fc.admit(req(body=b"y" * 100), [POD])
    assert err.value.code == "queue_full"
    done(fc, first)
    await asyncio.wait_for(waiting, 2)


async def test_without_the_gate_only_sheddables_are_refused() -> None:
    fc = make(queues=False)
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    second = await fc.admit(req(), [POD])  # saturated, not sheddable: through, no queue
    assert not second.waited
    with pytest.raises(RequestError):
        await fc.admit(req("batch"), [POD])
    for a in (first, second):
        a.finish()


async def test_queued_requests_for_a_free_pool_pass_a_blocked_one() -> None:
    other = ep("pod-b")
    fc = make()
    first = await fc.admit(req(), [POD])
    occupy(fc, first)
    blocked = asyncio.create_task(fc.admit(req(), [POD]))
    await started(fc, 1)
    free = await asyncio.wait_for(fc.admit(req(model="other"), [other]), 2)
    assert free.waited and not blocked.done()
    blocked.cancel()
    done(fc, first)


def test_an_unknown_objective_gets_priority_0_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    objectives = Objectives(OBJECTIVES)
    with caplog.at_level("WARNING"):
        for _ in range(3):
            r = req("platinum")
            objectives.classify(r)
            assert (r.objective, r.priority) == ("platinum", 0)
        objectives.classify(req(""))
    assert [m for m in caplog.messages if "platinum" in m] == [
        "unknown objective 'platinum' in x-gateway-inference-objective: priority 0"
    ]
    assert len(caplog.messages) == 1


def test_llm_ds_objective_header_is_read_first() -> None:
    objectives = Objectives(OBJECTIVES)
    r = req("batch")
    r.headers = {**r.headers, "x-llm-d-inference-objective": "gold"}
    objectives.classify(r)
    assert (r.objective, r.priority) == ("gold", 10)
