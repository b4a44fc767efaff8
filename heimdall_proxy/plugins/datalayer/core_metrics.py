"""core-metrics-extractor (llm-d's): what the scorers read of a pod's metrics page, and the
custom scalar metrics a config maps to endpoint attributes."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import Field, field_validator, model_validator

from heimdall_proxy.framework.attributes import CORE_METRICS_PRODUCER, publish_attribute
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.plugins import PROMETHEUS_DATA
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint

log = logging.getLogger(__name__)

CORE_METRICS_EXTRACTOR_TYPE = CORE_METRICS_PRODUCER
ENGINE_LABEL = "llm-d.ai/engine-type"
#: GIE's older label, read when the first is absent (llm-d still reads it).
LEGACY_ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
#: The engines llm-d knows without configuration.
BUILTIN_ENGINES = ("vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm", "triton")

_SPEC = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$")
_PAIR = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"?([^"]*)"?\s*$')


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A PromQL instant-selector, `name{label=value,...}` (values quoted or not)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> MetricSpec:
        m = _SPEC.match(text)
        if m is None:
            raise ValueError(f"not a valid metric specification: {text!r}")
        pairs = []
        for part in (m.group(2) or "").split(","):
            if not part.strip():
                continue
            pm = _PAIR.match(part)
            if pm is None:
                raise ValueError(f"invalid label pair {part!r} in specification {text!r}")
            pairs.append((pm.group(1), pm.group(2)))
        return cls(m.group(1), tuple(pairs))

    def value(self, families: Mapping[str, list[tuple[dict[str, str], float]]]) -> float:
        """The first sample of the family whose labels match (llm-d reads the newest by
        timestamp, and pages carry none). Raises ValueError when there is none."""
        for labels, value in families.get(self.name, ()):
            if all(labels.get(k) == v for k, v in self.labels):
                return value
        raise ValueError(f"no sample of {self.name!r} matches {dict(self.labels)}")


class CustomMetric(PluginParams):
    attribute_key: str
    metric_spec: str

    @field_validator("metric_spec")
    @classmethod
    def _spec(cls, value: str) -> str:
        MetricSpec.parse(value)
        return value


class EngineConfig(PluginParams):
    name: str
    queued_requests_spec: str = ""
    running_requests_spec: str = ""
    kv_usage_spec: str = ""
    lora_spec: str = ""
    cache_info_spec: str = ""
    cache_block_size_label_name: str = ""
    cache_num_blocks_label_name: str = ""
    cache_block_size_spec: str = ""
    cache_num_blocks_spec: str = ""
    custom_metrics: list[CustomMetric] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value:
            raise ValueError("engine config name cannot be empty")
        if value == "default":
            raise ValueError('engine config name cannot be "default" (reserved)')
        return value

    def standard_specs(self) -> list[str]:
        return [
            s
            for s in (
                self.queued_requests_spec,
                self.running_requests_spec,
                self.kv_usage_spec,
                self.lora_spec,
                self.cache_info_spec,
                self.cache_block_size_spec,
                self.cache_num_blocks_spec,
            )
            if s
        ]


class CoreMetricsParams(PluginParams):
    engine_label_key: str = ENGINE_LABEL
    default_engine: str = "vllm"
    engine_configs: list[EngineConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _default_known(self) -> CoreMetricsParams:
        names = [c.name for c in self.engine_configs]
        if len(set(names)) != len(names):
            raise ValueError("engineConfigs names an engine twice")
        if self.default_engine not in (*names, *BUILTIN_ENGINES):
            raise ValueError(f"defaultEngine {self.default_engine!r} not found in engineConfigs")
        return self


@register(CORE_METRICS_EXTRACTOR_TYPE, CoreMetricsParams)
class CoreMetricsExtractor(BasePlugin[CoreMetricsParams]):
    """The reader of the pods' metrics page (wire it to metrics-data-source). The gateway's
    scrape always reads vLLM's queue, running, KV-usage, LoRA and cache-config families into
    the pod's metrics snapshot, which the scorers and the attribute readers
    (`WaitingQueueSize`, `RunningRequestsSize`, `KVCacheUsagePercent`, ... of
    framework/attributes.py) read: one owner of those values.

    What this plugin adds: each engine config's `customMetrics` (`attributeKey` ->
    `metricSpec`, a `name{label=value}` selector) published on every scrape as the scalar
    attribute (attributeKey, "core-metrics-extractor"), the engine of a pod found by its
    `engineLabelKey` label (else GIE's older label, else `defaultEngine`).

    Not honoured, with a warning at load: standard specs of an engine other than vLLM's
    defaults (queuedRequestsSpec, kvUsageSpec, ... for sglang, trtllm-serve, Triton or a
    custom engine) and a non-vLLM `defaultEngine`: the scrape reads vLLM's metric names."""

    type = CORE_METRICS_EXTRACTOR_TYPE
    input_type = PROMETHEUS_DATA

    def __init__(self, name: str, params: CoreMetricsParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.custom: dict[str, list[tuple[str, MetricSpec]]] = {
            c.name: [(m.attribute_key, MetricSpec.parse(m.metric_spec)) for m in c.custom_metrics]
            for c in params.engine_configs
        }
        self.metric_families = frozenset(
            spec.name for specs in self.custom.values() for _, spec in specs
        )
        standard = [c.name for c in params.engine_configs if c.standard_specs()]
        if standard or params.default_engine != "vllm":
            log.warning(
                "plugin %r: metric specs of engines other than vLLM's are not honoured "
                "(engineConfigs %s, defaultEngine %r): the pods' pages are read with vLLM's "
                "metric names; customMetrics are honoured",
                name,
                standard,
                params.default_engine,
            )

    def engine_of(self, endpoint: Endpoint) -> str:
        labels = endpoint.labels
        return (
            labels.get(self.params.engine_label_key)
            or labels.get(LEGACY_ENGINE_LABEL)
            or self.params.default_engine
        )

    def extract(self, endpoint: Endpoint, data: object) -> None:
        if not isinstance(data, Mapping):
            raise ValueError("not a page's metric families")
        specs = self.custom.get(self.engine_of(endpoint), ())
        missing = []
        for key, spec in specs:
            try:
                publish_attribute(endpoint, key, self.type, spec.value(data))
            except ValueError as exc:
                missing.append(f"custom metric {key!r}: {exc}")
        if missing:
            raise ValueError("; ".join(missing))
