"""active-request-scorer: fewer requests in flight through this gateway, higher score."""

from __future__ import annotations

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
from heimdall_proxy.plugins.scorers.inflight import InFlight
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
    """Counts, per pod, the requests this gateway has sent it and not yet seen end: from the
    moment one is scheduled (pre_request) until it completes, fails, or its client
    disconnects (response_complete); a request older than `requestTimeout` stops counting.

    Score: a pod with at most `idleThreshold` requests in flight scores 1.0; a busier pod
    scores `maxBusyScore * (max - count) / max`, where max is the largest count among the
    candidates (so the busiest scores 0).

    With `redisConfig` / `valkeyConfig` (an extension), the counts are those of every live
    gateway replica sharing the store: each publishes its own every `syncInterval`, and a
    replica silent for `replicaTTL` (dead) no longer counts (heimdall_proxy.replicas)."""

    type = ACTIVE_REQUEST_SCORER_TYPE

    def __init__(self, name: str, params: ActiveRequestParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.inflight = InFlight(params.request_timeout)
        self._idle = params.idle_threshold
        self._busy = params.max_busy_score
        self.shared = shared_counters(self, params, self._published)

    def inherit(self, previous: ActiveRequestScorer, gone: frozenset[str]) -> str | None:
        """A reload keeps the ledger: the requests still running on the old plugins count
        against their pods here too (else every pod looks idle at the swap)."""
        self.inflight = previous.inflight
        self.inflight.timeout = self.params.request_timeout
        self.hand_over(previous)
        return None

    def _published(self) -> Mapping[str, float]:
        """What this replica publishes to the others: the ledger, unless a reload handed it
        over (both instances publishing it, under their own ids, would count it twice)."""
        return {} if self.handed_over else self.inflight.counts()

    def count(self, pod: str) -> int:
        """Requests in flight to `pod`, through this replica and (shared) the others."""
        self.inflight.expire()
        others = self.shared.others().get(pod, 0.0) if self.shared is not None else 0.0
        return self.inflight.count(pod) + int(others)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        self.inflight.expire()
        count = self.inflight.count
        if self.shared is None:
            counts = [count(e.name) for e in endpoints]
        else:
            others = self.shared.others()
            counts = [count(e.name) + int(others.get(e.name, 0.0)) for e in endpoints]
        top = max(counts) if counts else 0
        out = {}
        for e, n in zip(endpoints, counts, strict=True):
            out[e.name] = 1.0 if n <= self._idle else self._busy * (top - n) / top
        return out

    async def pre_request(self, ctx: RequestContext) -> None:
        self.inflight.add(ctx.target.name, ctx.key)
        if self.shared is not None:
            self.shared.changed()

    async def response_complete(self, ctx: RequestContext) -> None:
        self.inflight.remove(ctx.target.name, ctx.key)
        if self.shared is not None:
            self.shared.changed()
