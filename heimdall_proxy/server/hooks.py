"""The one hook runner for the request-control extension points (pre-request, response
received / streaming / complete). Bound methods are looked up once, when the gateway is
built, not per request: `response_streaming` runs for every chunk of every stream."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from heimdall_proxy.config.build import PluginSet

log = logging.getLogger(__name__)

Hook = Callable[..., Awaitable[None]]


class HookPoint:
    """The plugins implementing one extension point, as (name, bound method) pairs."""

    __slots__ = ("active", "hooks", "point")

    def __init__(self, point: str, plugins: Sequence[object]) -> None:
        self.point = point
        self.hooks: tuple[tuple[object, Hook], ...] = tuple(
            (getattr(p, "name", p), getattr(p, point)) for p in plugins
        )
        #: Whether any plugin implements the point: a plain attribute, which the relay tests
        #: several times per request (`bool(point)` would be a Python-level call each time).
        self.active = bool(self.hooks)

    def __bool__(self) -> bool:
        return self.active

    async def run(self, *args: Any) -> None:
        """Call every hook in declaration order. A failing hook is logged and never fails the
        request, nor keeps the next hook from running."""
        for name, hook in self.hooks:
            try:
                await hook(*args)
            except Exception:
                log.exception("%s hook %r failed", self.point, name)


class Hooks:
    __slots__ = ("pre_request", "response_complete", "response_received", "response_streaming")

    def __init__(self, plugins: PluginSet) -> None:
        self.pre_request = HookPoint("pre_request", plugins.pre_request)
        self.response_received = HookPoint("response_received", plugins.response_received)
        self.response_streaming = HookPoint("response_streaming", plugins.response_streaming)
        self.response_complete = HookPoint("response_complete", plugins.response_complete)
