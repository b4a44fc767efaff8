"""utilization-detector: saturation from the pods' own queue and KV-cache telemetry.

A pod scores max(queue / queueDepthThreshold, KV usage / kvCacheUtilThreshold); a pod whose
metrics are older than metricsStalenessThreshold (or were never read) scores 1.0, since
nothing says it has room. The pool's saturation is the mean over its pods. The scraped queue
lags, so requests this gateway sent that the last scrape cannot show yet (in flight beyond the
pod's waiting + running) count as queued, and admitted requests not sent anywhere yet are
spread over the pool: a burst cannot all pass between two scrapes.

As a filter it drops pods above the limits times (1 + headroom), keeping every pod when all
are over, so that scorers still pick the least bad one (GIE's fail-open)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import Duration, PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

UTILIZATION_DETECTOR_TYPE = "utilization-detector"


class UtilizationDetectorParams(PluginParams):
    queue_depth_threshold: int = Field(default=5, gt=0)
    kv_cache_util_threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    metrics_staleness_threshold: Duration = Field(default=0.2, gt=0.0)
    headroom: float = Field(default=0.0, ge=0.0)


@register(UTILIZATION_DETECTOR_TYPE, UtilizationDetectorParams)
class UtilizationDetector(BasePlugin[UtilizationDetectorParams]):
    type = UTILIZATION_DETECTOR_TYPE

    def __init__(self, name: str, params: UtilizationDetectorParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.load = handle.load

    def _queue(self, ep: Endpoint) -> float:
        """The pod's queue as the gateway best knows it: scraped waiting requests plus the
        requests it sent that the scrape does not show yet."""
        m = ep.metrics
        unseen = self.load.requests.get(ep.name, 0) - (m.waiting + m.running)
        # Comparisons where max() stood (here and in _score), as max() decides ties and NaN:
        # this runs per candidate per request, and a builtin call costs more than all of it.
        return float(m.waiting + unseen if unseen > 0 else m.waiting)

    def _score(self, ep: Endpoint, now: float, extra_queue: float) -> float:
        p = self.params
        m = ep.metrics
        if m.updated_at == 0.0 or (
            not m.held and now - m.updated_at > p.metrics_staleness_threshold
        ):
            return 1.0
        queue = (self._queue(ep) + extra_queue) / p.queue_depth_threshold
        kv = m.kv_cache_usage / p.kv_cache_util_threshold
        return kv if kv > queue else queue

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        now = time.monotonic()
        extra = self.load.pending / len(endpoints)
        return sum(self._score(ep, now, extra) for ep in endpoints) / len(endpoints)

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        p = self.params
        max_queue = p.queue_depth_threshold * (1.0 + p.headroom)
        max_kv = min(1.0, p.kv_cache_util_threshold * (1.0 + p.headroom))
        now = time.monotonic()
        kept = [
            ep
            for ep in endpoints
            if ep.metrics.updated_at != 0.0
            and (ep.metrics.held or now - ep.metrics.updated_at <= p.metrics_staleness_threshold)
            and self._queue(ep) <= max_queue
            and ep.metrics.kv_cache_usage <= max_kv
        ]
        return kept or endpoints
