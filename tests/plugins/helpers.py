"""Plain objects for plugin unit tests (the pod helper `ep` is the suite's, tests/helpers)."""

from __future__ import annotations

import time
from typing import Any

from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import InFlightLoad, LoadEstimate
from heimdall_proxy.framework.types import (
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    RequestContext,
    SchedulingResult,
)
from heimdall_proxy.requesthandling.usage import sse_events


def req(
    api: ApiKind = "chat",
    data: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    model: str = "m",
) -> InferenceRequest:
    data = {"model": model, **(data or {})}
    return InferenceRequest(
        api=api, path="/v1/x", model=model, body=b"{}", data=data, headers=headers or {}
    )


def ctx(request: InferenceRequest, target: Endpoint, attempt: int = 0) -> RequestContext:
    result = SchedulingResult({"default": ProfileResult([target], [target])}, "default")
    return RequestContext(request, CycleState(), result, target, attempt=attempt)


def ledger() -> PluginHandle:
    """A plugin handle with an in-flight ledger of its own (a gateway's one)."""
    return PluginHandle(EndpointPool([]), load=InFlightLoad())


def sent(load: InFlightLoad, c: RequestContext) -> RequestContext:
    """What the relay does as attempt `c` starts: the gateway's ledger counts it (before any
    pre_request hook runs)."""
    load.acquire(c.key, c.target.name, *LoadEstimate()(c))
    return c


async def streamed(plugin: Any, c: RequestContext, chunk: bytes, now: float = 0.0) -> None:
    """What the relay does with a chunk of a stream: notes its arrival (at `now`, else the
    present) and its events once, on the context, then runs the plugin's response_streaming
    hook."""
    c.chunk_arrived(sse_events(chunk), now or time.monotonic())
    await plugin.response_streaming(c, chunk)
