"""Attributes: data one plugin publishes and others read without importing it, keyed as llm-d
keys its attribute maps ("<attribute>/<producer>", its DataKey's string form).

Two stores use the keys: an Endpoint's `attributes` (what data-layer extractors learned about
a pod: its topology, a GPU utilization) and, for one request, the CycleState (what a producer
learned about the request: its session id). A reader names the attribute and its producer,
as llm-d's configs do, and never the producer's module."""

from __future__ import annotations

import logging
import math

from heimdall_proxy.framework.types import Endpoint

log = logging.getLogger(__name__)


def data_key(attribute: str, producer: str) -> str:
    """The key of `attribute` as `producer` publishes it (llm-d's DataKey.String())."""
    return f"{attribute}/{producer}"


def scalar_attribute(endpoint: Endpoint, key: str) -> float | None:
    """The pod's numeric attribute under `key`, None when it has none (or a value that is
    not a number: a reader treats it as missing, as llm-d's typed read does)."""
    value = endpoint.attributes.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if not math.isnan(value) else None


#: The producer a numeric attribute named without one is read from: llm-d's core metrics
#: extractor, which publishes the custom metrics its config names.
CORE_METRICS_EXTRACTOR_TYPE = "core-metrics-extractor"


def configured_key(attribute: str, producer: str | None) -> str:
    """The key a reader's `attribute` / `producer` parameters name (llm-d's
    ResolveConfiguredKey): an unset producer means the core metrics extractor; a set one is
    taken as it is, "" naming an attribute published under no producer.

    An attribute with a "/" and no producer is refused: it is most likely the old combined
    "attribute/producer" spelling, whose key matches nothing, so a filter would pass every
    pod and a scorer score 0 without a word. Raises ValueError."""
    if producer is not None:
        return data_key(attribute, producer)
    if "/" in attribute:
        head, _, tail = attribute.rpartition("/")
        raise ValueError(
            f"attribute {attribute!r} contains '/' but no producer is set: the attribute and "
            f"its producer are separate parameters (attribute: {head!r}, producer: {tail!r}); "
            "if the name itself contains '/', set producer explicitly"
        )
    return data_key(attribute, CORE_METRICS_EXTRACTOR_TYPE)


def warn_core_metrics(name: str, plugin_type: str, attribute: str, producer: str | None) -> None:
    """A reader whose attribute names no producer reads the core metrics extractor's, which
    this gateway does not have: every pod lacks it. Said once, at load, never silently."""
    if producer is None:
        log.warning(
            "plugin %r (type %r): attribute %r is read from %s (no producer is set), which "
            "this gateway does not have, so every pod lacks it; set `producer` to the "
            "extractor that publishes it",
            name,
            plugin_type,
            attribute,
            CORE_METRICS_EXTRACTOR_TYPE,
        )
