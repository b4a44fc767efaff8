"""The one list of built-in plugins (heimdall_proxy/plugins/builtins.py) and, per registered type, the
extension points it implements: a plugin that gains or loses a hook (and so starts or stops
running on every request) changes this table on purpose, never by accident."""

from __future__ import annotations

import inspect
from typing import Protocol

from heimdall_proxy.framework import flowcontrol, inflight, plugins
from heimdall_proxy.plugins.builtins import load_builtin_plugins

EXPECTED: dict[str, list[str]] = {
    "anthropic-parser": ["Parser"],
    "openai-parser": ["Parser"],
    "passthrough-parser": ["Parser"],
    "sglanghttp-parser": ["Parser"],
    "vllmhttp-parser": ["Parser"],
    "active-request-scorer": ["Lifecycle", "Scorer"],  # its counts are the ledger's
    "always-disagg-multimodal-decider": ["Decider"],
    "always-disagg-pd-decider": ["Decider"],
    "approx-prefix-cache-producer": ["Inherits", "Lifecycle", "PreRequest", "Producer"],
    "by-label": ["Filter"],
    "by-label-selector": ["Filter"],
    "concurrency-detector": ["Filter", "SaturationDetector"],
    "context-length-aware": ["Filter", "Scorer"],
    "decode-filter": ["Filter"],
    "disagg-headers-handler": ["PreRequest"],
    "disagg-profile-handler": ["PreRequest", "ProfileHandler"],  # llm-d's headers
    "encode-filter": ["Filter"],
    "fcfs-ordering-policy": ["OrderingPolicy"],
    "global-strict-fairness-policy": ["FairnessPolicy"],
    "inflight-load-producer": ["Lifecycle", "LoadEstimator", "MetricsSource"],
    "kv-cache-utilization-scorer": ["Scorer"],
    "latency-scorer": ["Scorer"],
    "latency-slo-admitter": ["Admitter"],
    "load-aware-scorer": ["Scorer"],
    "lora-affinity-scorer": ["Scorer"],
    "finish-time-scorer": ["Scorer"],
    "max-score-picker": ["Picker"],
    "model-server-protocol-models": ["DataExtractor"],
    "models-data-source": ["DataSource"],
    "no-hit-lru-scorer": ["ChecksPeers", "Inherits", "Lifecycle", "PreRequest", "Scorer"],
    "outstanding-work-scorer": [
        "Inherits",
        "Lifecycle",
        "PreRequest",
        "ResponseComplete",
        "ResponseReceived",
        "ResponseStreaming",
        "Scorer",
    ],
    "pd-profile-handler": ["PreRequest", "ProfileHandler"],
    "precise-prefix-cache-producer": [
        "EndpointExtractor",  # endpoint-notification-source: follows a joining pod at once
        "Lifecycle",
        "MetricsSource",
        "PreRequest",
        "Producer",
    ],
    "precise-prefix-cache-scorer": [
        "EndpointExtractor",
        "Lifecycle",
        "MetricsSource",
        "PreRequest",
        "Producer",
        "Scorer",
    ],
    "predicted-latency-producer": [
        "Inherits",
        "Lifecycle",
        "MetricsSource",
        "PreRequest",
        "Producer",
        "ResponseComplete",
        "ResponseStreaming",
    ],
    "predicted-latency-scorer": [
        "Inherits",
        "Lifecycle",
        "MetricsSource",
        "PreRequest",
        "Producer",
        "ResponseComplete",
        "ResponseStreaming",
        "Scorer",
    ],
    "prefill-filter": ["Filter"],
    "prefill-header-handler": ["PreRequest"],
    "prefix-based-pd-decider": ["Decider"],
    "prefix-cache-affinity-filter": [
        "Filter",
        "Inherits",
        "Lifecycle",
        "PreRequest",
        "ResponseComplete",
        "ResponseStreaming",
    ],
    "prefix-cache-scorer": ["Scorer"],
    "queue-scorer": ["Scorer"],
    "random-picker": ["Picker"],
    "response-header-handler": ["ResponseReceived"],
    "responses-store": [
        "Inherits",
        "Lifecycle",
        "MetricsSource",
        "PrepareData",
        "ResponseComplete",
        "ResponseReceived",
        "ResponseStreaming",
        "ResponsesStoreAPI",
    ],
    "round-robin-fairness-policy": ["FairnessPolicy"],
    "running-requests-size-scorer": ["Scorer"],
    "session-affinity-scorer": ["Inherits", "PreRequest", "ResponseReceived", "Scorer"],
    "single-profile-handler": ["ProfileHandler"],
    "slo-headroom-tier-filter": ["Filter"],
    "token-load-scorer": ["Scorer"],
    "token-producer": ["Lifecycle", "PrepareData"],
    "tokenizer": ["Lifecycle", "PrepareData"],
    "utilization-detector": ["Filter", "SaturationDetector"],
    "weighted-random-picker": ["Picker"],
    # admission and flow control from llm-d (issue 35)
    "agent-identity": ["RequestHeader"],
    "edf-ordering-policy": ["OrderingPolicy"],
    "priority-holdback-policy": ["UsageLimitPolicy"],
    "probabilistic-admitter": ["Admitter"],
    "program-aware-fairness": [
        "FairnessPolicy",
        "MetricsSource",
        "PreRequest",
        "ResponseComplete",
    ],
    "slo-deadline-ordering-policy": ["OrderingPolicy"],
    "soft-reflective-ceiling-policy": ["UsageLimitPolicy"],
    "static-usage-limit-policy": ["UsageLimitPolicy"],
    # issue 35: llm-d's scheduling plugins
    "data-parallel-profile-handler": ["PreRequest", "ProfileHandler"],
    "endpoint-attribute-filter": ["ChecksPeers", "Filter"],  # warns of an unpublished attribute
    "endpoint-attribute-scorer": ["ChecksPeers", "Scorer"],
    "header-label-affinity-scorer": ["Scorer"],
    "header-profile-handler": ["ProfileHandler"],
    "label-selector-filter": ["Filter"],
    "session-affinity-filter": ["Filter", "Inherits", "PreRequest", "ResponseReceived"],
    "session-id-producer": ["Producer"],
    "topology-affinity-filter": ["Filter"],
    "topology-affinity-scorer": ["Scorer"],
    "topology-extractor": ["Producer"],
    "utilization-filter": ["Filter"],
    # data layer, producers and reporting from llm-d (issue 35)
    "burst-prefix-cache-producer": ["Producer"],
    "core-metrics-extractor": ["DataExtractor"],
    "dcgm-data-source": ["DataSource"],
    "dcgm-extractor": ["DataExtractor"],
    "endpoint-notification-source": ["DataSource"],
    "k8s-notification-source": ["DataSource"],
    "metrics-data-source": ["DataSource"],
    "mm-embeddings-cache-producer": [
        "EndpointExtractor",
        "MetricsSource",
        "PreRequest",
        "Producer",
    ],
    "mm-embeddings-cache-scorer": ["Scorer"],
    "models-data-extractor": ["DataExtractor"],
    "request-attribute-reporter": ["MetricsSource", "ResponseComplete"],
    # refused at load, saying why (plugins/datalayer/refused.py)
    "mock-metrics-source": [],
    "multicluster-approx-prefix-cache-producer": [],
    "multicluster-file-discovery": [],
    "multicluster-kv-cache-utilization-scorer": [],
    "multicluster-metrics-data-source": [],
    "multicluster-metrics-extractor": [],
    "multicluster-prefix-cache-scorer": [],
    "multicluster-queue-scorer": [],
    "multicluster-session-affinity-filter": [],
}


def extension_points() -> dict[str, str]:
    """method name -> the Protocol (extension point) that declares it."""
    out: dict[str, str] = {}
    for mod in (plugins, flowcontrol, inflight):
        for name, obj in vars(mod).items():
            if (
                inspect.isclass(obj)
                and Protocol in obj.__mro__[1:]
                and obj.__module__ == mod.__name__
            ):
                for method, value in obj.__dict__.items():
                    if not method.startswith("_") and callable(value):
                        out.setdefault(method, name)
    return out


def implemented(cls: object, points: dict[str, str]) -> list[str]:
    return sorted(
        {point for method, point in points.items() if callable(getattr(cls, method, None))}
    )


def test_every_builtin_type_implements_the_pinned_extension_points() -> None:
    points = extension_points()
    got: dict[str, list[str]] = {}
    for spec in load_builtin_plugins():
        assert inspect.isclass(spec.factory), spec.type_name
        got[spec.type_name] = implemented(spec.factory, points)
    assert got == EXPECTED
