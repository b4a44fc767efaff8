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
    CandidateNames,
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
)
from heimdall_proxy.plugins.scheduling.scorers.shared_state import (
    SharedCountsParams,
    SharesState,
    ledger_store,
    warn_ledger_alias,
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

    The counts are every live gateway replica's when the ledger is shared (inflight-load-
    producer's `redisConfig`, replicas/ledger.py); then `requestTimeout` applies to this
    replica's requests, the others' counting until their own ledgers expire them. This
    scorer's own `redisConfig` / `valkeyConfig` (and `syncInterval`, `replicaTTL`), from
    before the ledger was one, still share the ledger through that store (deprecated:
    a warning says to move them to inflight-load-producer)."""

    type = ACTIVE_REQUEST_SCORER_TYPE

    def __init__(self, name: str, params: ActiveRequestParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.load = handle.load
        self._timeout = params.request_timeout
        self._idle = params.idle_threshold
        self._busy = params.max_busy_score
        self.ledger_store = ledger_store(self, params)
        if self.ledger_store is not None:
            warn_ledger_alias(self)

    def _cutoff(self) -> float:
        return time.monotonic() - self._timeout if self._timeout > 0 else -math.inf

    def count(self, pod: str) -> int:
        """Requests in flight to `pod`, through this replica and (shared) the others."""
        return self.load.requests_since(pod, self._cutoff())

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        # Only pods with requests in flight can score below 1.0 (a count of 0 is within any
        # idleThreshold): those are visited, the others share the default.
        cutoff = self._cutoff()
        since = self.load.requests_since
        candidates = CandidateNames.of(endpoints).name_set()
        counts = {pod: since(pod, cutoff) for pod in self.load.busy_pods() if pod in candidates}
        top = max(counts.values()) if counts else 0
        idle, busy = self._idle, self._busy
        changed = {pod: busy * (top - n) / top for pod, n in counts.items() if n > idle}
        return DefaultScores(endpoints, 1.0, changed)
