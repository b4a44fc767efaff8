"""kv-cache-utilization-scorer: emptier KV cache, higher score."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

KV_CACHE_UTILIZATION_SCORER_TYPE = "kv-cache-utilization-scorer"


@register(KV_CACHE_UTILIZATION_SCORER_TYPE)
class KVCacheUtilizationScorer(BasePlugin[NoParams]):
    """Reads `vllm:kv_cache_usage_perc` (a 0..1 fraction): score = 1 - usage, clamped."""

    type = KV_CACHE_UTILIZATION_SCORER_TYPE

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        return {e.name: _clamp(1.0 - e.metrics.kv_cache_usage) for e in endpoints}


def _clamp(free: float) -> float:
    """`free` within [0, 1], NaN as 0, as `min(1.0, max(0.0, free))` gives it, without the
    two builtin calls per pod (each dearer than this whole function)."""
    return 1.0 if free > 1.0 else free if free > 0.0 else 0.0
