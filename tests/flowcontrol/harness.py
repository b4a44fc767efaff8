"""A flow controller over one pod for policy tests: a concurrency-detector (its saturation is
the in-flight count the test sets, over maxConcurrency), the policies under test, and a way
to see in which order queued requests come out."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from heimdall_proxy.config.flow import FlowControlConfig, ObjectiveConfig, PriorityBandConfig
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.flowcontrol.controller import FlowController
from heimdall_proxy.flowcontrol.metrics import FlowMetrics
from heimdall_proxy.flowcontrol.objectives import Objectives
from heimdall_proxy.framework.flowcontrol import FairnessPolicy, OrderingPolicy, UsageLimitPolicy
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import InferenceRequest
from heimdall_proxy.plugins.flowcontrol.fcfs import FCFSOrdering
from heimdall_proxy.plugins.flowcontrol.global_strict import GlobalStrictFairness
from heimdall_proxy.plugins.flowcontrol.saturation.concurrency import (
    ConcurrencyDetector,
    ConcurrencyDetectorParams,
)
from tests.helpers import ep

POD = ep("pod-a")
OBJECTIVES = [
    ObjectiveConfig(name="gold", priority=10),
    ObjectiveConfig(name="batch", priority=-1),
]


def controller(
    flow: dict[str, Any] | None = None,
    *,
    fairness: FairnessPolicy | None = None,
    ordering: OrderingPolicy | None = None,
    usage_limit: UsageLimitPolicy | None = None,
    max_concurrency: int = 1,
    queues: bool = True,
) -> FlowController:
    """A controller over a concurrency-detector of `max_concurrency`; `queues` False: no
    flowControl section at all (requests over the limit are refused, not queued)."""
    handle = PluginHandle(EndpointPool([]))
    detector = ConcurrencyDetector(
        "d", ConcurrencyDetectorParams(maxConcurrency=max_concurrency), handle
    )
    fair = fairness or GlobalStrictFairness("gs", NoParams(), handle)
    order = ordering or FCFSOrdering("fcfs", NoParams(), handle)

    def policies(band: PriorityBandConfig) -> tuple[FairnessPolicy, OrderingPolicy]:
        return fair, order

    return FlowController(
        detector,
        handle.load,
        Objectives(OBJECTIVES),
        FlowControlConfig.model_validate(flow or {}) if queues else None,
        policies,
        FlowMetrics(None),
        usage_limit=usage_limit,
    )


def request(
    objective: str = "", headers: dict[str, str] | None = None, model: str = "m"
) -> InferenceRequest:
    h = dict(headers or {})
    if objective:
        h["x-gateway-inference-objective"] = objective
    return InferenceRequest("completions", "/v1/completions", model, b"{}", {}, h)


def hold(fc: FlowController, n: int) -> None:
    """Make `n` requests in flight on the pod (the saturation is n / maxConcurrency)."""
    for i in range(n):
        fc.load.acquire(f"held-{i}", POD.name, 1)


def let_go(fc: FlowController, n: int) -> None:
    for i in range(n):
        fc.load.release(f"held-{i}")
    fc.wake()


async def queued(fc: FlowController, n: int) -> None:
    for _ in range(400):
        if fc.queued == n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"queued {fc.queued}, want {n}")


async def release_order(
    fc: FlowController, labelled: Sequence[tuple[str, InferenceRequest]], held: int
) -> list[str]:
    """Queue every request while `held` requests keep the pod full (maxConcurrency 1 = held
    1), then free the pod and let each request out, one at a time: the order they left in.
    Each one runs to its end before the next goes, so one request is in flight at a time."""
    order: list[str] = []

    async def one(label: str, ireq: InferenceRequest) -> None:
        admission = await fc.admit(ireq, [POD])
        order.append(label)
        admission.sent()
        fc.load.acquire(label, POD.name, 1)
        await asyncio.sleep(0)
        fc.load.release(label)
        admission.finish()

    tasks = []
    for label, ireq in labelled:
        tasks.append(asyncio.create_task(one(label, ireq)))
        await queued(fc, len(tasks))
    let_go(fc, held)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    return order
