"""Config of admission and flow control: what Kubernetes resources and the EPP's own sections
give a Heimdall EPP, for a standalone gateway.

- `objectives:` stands in for InferenceObjective resources: `{name, priority}`, chosen per
  request by `x-gateway-inference-objective`. Higher priority is more important; the default
  is 0; a negative priority marks the request sheddable.
- `saturationDetector:` either names a detector plugin (`pluginRef`, llm-d's shape) or holds
  GIE's utilization parameters directly (`queueDepthThreshold`, `kvCacheUtilThreshold`,
  `metricsStalenessThreshold`), as the older EPP did. Omitted: a utilization-detector with
  its defaults.
- `flowControl:` llm-d's section, honoured when the `flowControl` feature gate is on: global
  and per-band bounds in requests and bytes, the queue-wait budgets, the fairness and
  ordering policies of each band."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from heimdall_proxy.framework.params import Duration, PluginParams, Quantity

#: The feature gate that turns on queueing (without it, saturation only sheds sheddables).
FLOW_CONTROL_GATE = "flowControl"
#: llm-d's per-band defaults: 1G bytes and 5000 requests when a band leaves them unset or 0.
BAND_MAX_BYTES = 1_000_000_000
BAND_MAX_REQUESTS = 5000


class ObjectiveConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    priority: int = 0


class SaturationDetectorConfig(PluginParams):
    """`pluginRef` names a detector in `plugins`; otherwise the remaining keys are a
    utilization-detector's parameters."""

    plugin_ref: str | None = None

    def detector_params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class PriorityBandConfig(PluginParams):
    priority: int = 0
    max_bytes: Quantity = 0
    max_requests: Quantity = 0
    fairness_policy_ref: str = ""
    ordering_policy_ref: str = ""

    @property
    def request_limit(self) -> int:
        return self.max_requests or BAND_MAX_REQUESTS

    @property
    def byte_limit(self) -> int:
        return self.max_bytes or BAND_MAX_BYTES


class FlowControlConfig(PluginParams):
    max_bytes: Quantity = 0
    max_requests: Quantity = 0
    default_request_ttl: Duration = Field(default=60.0, alias="defaultRequestTTL")
    no_endpoint_request_ttl: Duration = Field(default=60.0, alias="noEndpointRequestTTL")
    default_priority_band: PriorityBandConfig | None = None
    default_negative_priority_band: PriorityBandConfig | None = None
    priority_bands: list[PriorityBandConfig] = Field(default_factory=list)
    usage_limit_policy_plugin_ref: str = ""
    saturation_detector: SaturationDetectorConfig | None = None
    enable_eviction: bool = False

    @model_validator(mode="after")
    def _unique_bands(self) -> FlowControlConfig:
        seen: set[int] = set()
        for band in self.priority_bands:
            if band.priority in seen:
                raise ValueError(f"priorityBands: priority {band.priority} is listed twice")
            seen.add(band.priority)
        return self

    def band(self, priority: int) -> PriorityBandConfig:
        """The band config for `priority`: its own entry, else the negative template for a
        negative priority, else the default template, else the defaults."""
        for band in self.priority_bands:
            if band.priority == priority:
                return band
        template = (self.default_negative_priority_band if priority < 0 else None) or (
            self.default_priority_band
        )
        if template is None:
            return PriorityBandConfig(priority=priority)
        return template.model_copy(update={"priority": priority})

    def queues_sheddable(self) -> bool:
        """Whether the operator gave negative priorities a band of their own (then sheddable
        requests queue in it, as in llm-d); otherwise they are shed as soon as the pool is
        saturated, as GIE's admission does."""
        return self.default_negative_priority_band is not None or any(
            b.priority < 0 for b in self.priority_bands
        )
