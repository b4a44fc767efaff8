"""llm-d types that cannot run here, each refused at load with why and what to use instead:
a config naming one fails loudly rather than loading without what it asked for.

- `mock-metrics-source`: not a plugin of llm-d's at all. Its integration-test harness
  registers it under that name and feeds it hand-written metrics; no EPP binary knows it.
- the multicluster types: they route between clusters, each peer cluster an endpoint reached
  through its gateway and scored by the pool averages its own EPP exports. This gateway
  routes to pods of one pool."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register

MOCK_METRICS_SOURCE_TYPE = "mock-metrics-source"
#: Every multicluster type of llm-d's (the data layer's, and the scheduling and producer
#: variants that read what they collect).
MULTICLUSTER_TYPES = (
    "multicluster-metrics-data-source",
    "multicluster-metrics-extractor",
    "multicluster-file-discovery",
    "multicluster-approx-prefix-cache-producer",
    "multicluster-session-affinity-filter",
    "multicluster-kv-cache-utilization-scorer",
    "multicluster-prefix-cache-scorer",
    "multicluster-queue-scorer",
)

_MULTICLUSTER_WHY = (
    "multicluster plugins route between clusters (each peer cluster an endpoint reached "
    "through its gateway, scored by the pool averages its EPP exports); this gateway routes "
    "to the pods of one pool. Route to each cluster's own gateway instead; within one pool "
    "use the type without the multicluster- prefix (metrics-data-source with "
    "core-metrics-extractor, queue-scorer, prefix-cache-scorer, ...)"
)


class AnyParams(PluginParams):
    """Whatever was given: the type is refused before its parameters matter."""


@register(MOCK_METRICS_SOURCE_TYPE, AnyParams)
class MockMetricsSource(BasePlugin[AnyParams]):
    """Refused at load: llm-d's integration-test harness registers this fake under that name
    to feed its EPP hand-written metrics; no EPP binary knows it. Use metrics-data-source
    with core-metrics-extractor: the pods' own metrics."""

    type = MOCK_METRICS_SOURCE_TYPE

    def __init__(self, name: str, params: AnyParams, handle: PluginHandle) -> None:
        raise ValueError(
            "mock-metrics-source is not a plugin of llm-d's: its integration tests register "
            "it to feed the EPP hand-written metrics, and no EPP knows it. Use "
            "metrics-data-source with core-metrics-extractor, which read the pods' own "
            "metrics (and run whether or not they are declared)"
        )


@register(MULTICLUSTER_TYPES[0], AnyParams, aliases=MULTICLUSTER_TYPES[1:])
class MultiClusterType(BasePlugin[AnyParams]):
    """Refused at load: llm-d's multicluster plugins route between clusters, each peer
    cluster an endpoint reached through its gateway and scored by the pool averages its own
    EPP exports; this gateway routes to the pods of one pool."""

    type = MULTICLUSTER_TYPES[0]

    def __init__(self, name: str, params: AnyParams, handle: PluginHandle) -> None:
        raise ValueError(f"not supported: {_MULTICLUSTER_WHY}")
