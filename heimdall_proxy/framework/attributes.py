"""Attributes: data one plugin publishes and others read without importing it, keyed as llm-d
keys them, by (attribute name, producer).

On an Endpoint (`Endpoint.attributes`): what data-layer extractors learned about a pod, e.g.
("GPUUtilization", "dcgm-extractor") or its ("Topology", "topology-extractor"). Generic
readers (endpoint-attribute-filter / -scorer) name the pair in their config and read it here,
without importing the producer. The core metrics every scrape reads (queue, running, KV
usage) are the pod's `Metrics` snapshot rather than copies in the map, so they are answered
from it: one owner per datum.

For one request, on the CycleState under `data_key(name, producer)`: what a producer learned
about the request (its session id)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from heimdall_proxy.framework.types import Endpoint, Metrics

log = logging.getLogger(__name__)

#: The producer type of the core metrics (llm-d's core-metrics-extractor), which a reader
#: that names no producer reads.
CORE_METRICS_PRODUCER = "core-metrics-extractor"

#: The core metrics extractor's standard attributes, answered from the scrape's snapshot.
_CORE: dict[str, Callable[[Metrics], float]] = {
    "WaitingQueueSize": lambda m: float(m.waiting),
    "RunningRequestsSize": lambda m: float(m.running),
    "KVCacheUsagePercent": lambda m: m.kv_cache_usage,
    "MaxActiveModels": lambda m: float(m.max_lora),
    "ActiveModels": lambda m: float(len(m.lora_running)),
    "WaitingModels": lambda m: float(len(m.lora_waiting)),
}


def publish_attribute(endpoint: Endpoint, name: str, producer: str, value: object) -> None:
    """Set one attribute of `endpoint` (replacing the producer's previous value)."""
    endpoint.attributes[name, producer] = value


def read_attribute(
    endpoint: Endpoint, name: str, producer: str = CORE_METRICS_PRODUCER
) -> float | None:
    """The numeric attribute `name` of `producer` on `endpoint`; None when it was never
    published (a core metric: when the pod was never scraped), or is not a number (NaN
    included: a reader treats it as missing, as llm-d's typed read does a wrong type)."""
    value = endpoint.attributes.get((name, producer))
    if value is None and producer == CORE_METRICS_PRODUCER:
        read = _CORE.get(name)
        if read is not None and endpoint.metrics.updated_at:
            return read(endpoint.metrics)
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def is_core_metric(name: str) -> bool:
    """Whether the core metrics extractor publishes `name` whatever its configuration."""
    return name in _CORE


def data_key(name: str, producer: str) -> str:
    """The CycleState key of a request attribute (llm-d's DataKey string form)."""
    return f"{name}/{producer}"


def configured_producer(name: str, producer: str | None) -> str:
    """The producer a reader's `attribute` / `producer` parameters name (llm-d's
    ResolveConfiguredKey): unset means the core metrics extractor; a set one is taken as it
    is, "" naming an attribute published under no producer.

    An attribute with a "/" and no producer is refused: it is most likely the old combined
    "attribute/producer" spelling, whose key matches nothing, so a filter would pass every
    pod and a scorer score 0 without a word. Raises ValueError."""
    if producer is not None:
        return producer
    if "/" in name:
        head, _, tail = name.rpartition("/")
        raise ValueError(
            f"attribute {name!r} contains '/' but no producer is set: the attribute and its "
            f"producer are separate parameters (attribute: {head!r}, producer: {tail!r}); if "
            "the name itself contains '/', set producer explicitly"
        )
    return CORE_METRICS_PRODUCER


def warn_unpublished(
    name: str, plugin_type: str, attribute: str, producer: str, plugins: dict[str, object]
) -> None:
    """A reader of a core-metrics custom attribute in a config without a core metrics
    extractor reads what no one publishes: every pod lacks it. Said once, at load."""
    if producer != CORE_METRICS_PRODUCER or is_core_metric(attribute):
        return
    if any(getattr(p, "type", None) == CORE_METRICS_PRODUCER for p in plugins.values()):
        return
    log.warning(
        "plugin %r (type %r): attribute %r is read from %s (no producer is set), which this "
        "config does not declare, so every pod lacks it; set `producer` to the extractor "
        "that publishes it",
        name,
        plugin_type,
        attribute,
        CORE_METRICS_PRODUCER,
    )
