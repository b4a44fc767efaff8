"""active-request-scorer: fewer requests in flight through this gateway, higher score."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import Duration
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.plugins.scorers.shared_state import (
    SharedCountsParams,
    SharesState,
    shared_counters,
)

ACTIVE_REQUEST_SCORER_TYPE = "active-request-scorer"


class ActiveRequestParams(SharedCountsParams):
    request_timeout: Duration = 120.0
    idle_threshold: int = Field(default=0, ge=0)
    max_busy_score: float = Field(default=1.0, ge=0.0, le=1.0)


@register(ACTIVE_REQUEST_SCORER_TYPE, ActiveRequestParams)
class ActiveRequestScorer(SharesState, BasePlugin[ActiveRequestParams]):
    """Counts, per pod, the requests this gateway has sent it and not yet seen end, as the
    gateway's in-flight ledger holds them (framework/inflight.py: from dispatch until the
    attempt completes, fails, or its client disconnects); a request older than
    `requestTimeout` stops counting here. Keeps no count of its own.

    Score: a pod with at most `idleThreshold` requests in flight scores 1.0; a busier pod
    scores `maxBusyScore * (max - count) / max`, where max is the largest count among the
    candidates (so the busiest scores 0).

    With `redisConfig` / `valkeyConfig` (an extension), the counts are those of every live
    gateway replica sharing the store: each publishes its own every `syncInterval`, and a
    replica silent for `replicaTTL` (dead) no longer counts (heimdall_proxy.replicas)."""

    type = ACTIVE_REQUEST_SCORER_TYPE

    def __init__(self, name: str, params: ActiveRequestParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.load = handle.load
        self._timeout = params.request_timeout
        self._idle = params.idle_threshold
        self._busy = params.max_busy_score
        self.shared = shared_counters(self, params, self._published)

    def inherit(self, previous: ActiveRequestScorer, gone: frozenset[str]) -> str | None:
        """A reload hands the replica sharing over; the counts are the ledger's, which the
        gateway keeps across reloads."""
        self.hand_over(previous)
        return None

    def _cutoff(self) -> float:
        return time.monotonic() - self._timeout if self._timeout > 0 else -math.inf

    def _published(self) -> Mapping[str, float]:
        """What this replica publishes to the others: its ledger's counts, unless a reload
        handed the sharing over (both instances publishing, under their own ids, would count
        them twice)."""
        if self.handed_over:
            return {}
        cutoff = self._cutoff()
        since = self.load.requests_since
        return {pod: float(n) for pod in self.load.requests if (n := since(pod, cutoff))}

    def count(self, pod: str) -> int:
        """Requests in flight to `pod`, through this replica and (shared) the others."""
        others = self.shared.others().get(pod, 0.0) if self.shared is not None else 0.0
        return self.load.requests_since(pod, self._cutoff()) + int(others)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        cutoff = self._cutoff()
        since = self.load.requests_since
        if self.shared is None:
            counts = [since(e.name, cutoff) for e in endpoints]
        else:
            others = self.shared.others()
            counts = [since(e.name, cutoff) + int(others.get(e.name, 0.0)) for e in endpoints]
        top = max(counts) if counts else 0
        out = {}
        for e, n in zip(endpoints, counts, strict=True):
            out[e.name] = 1.0 if n <= self._idle else self._busy * (top - n) / top
        return out

    async def pre_request(self, ctx: RequestContext) -> None:
        if self.shared is not None:  # the ledger counted it: the others hear of it
            self.shared.changed()

    async def response_complete(self, ctx: RequestContext) -> None:
        if self.shared is not None:
            self.shared.changed()
