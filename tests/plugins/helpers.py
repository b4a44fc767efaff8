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


def teach_pace(owner: Any, pod: Endpoint, tpot: float, now: float = 1000.0) -> None:
    """A stream of 100 prompt tokens on `pod` that ran to its end in `owner.load`'s ledger (a
    plugin's or a handle's): first chunk 0.1 s after `now`, then `tpot` a token."""
    load = owner.load
    c = ctx(req("completions", {"prompt": "x" * 400, "max_tokens": 5}), pod)
    load.acquire(c.key, pod.name, prompt=100, whole=100, now=now, ctx=c)
    c.chunk_arrived(1, now + 0.1)
    c.chunk_arrived(4, now + 0.1 + 4 * tpot)
    load.release(c.key)
