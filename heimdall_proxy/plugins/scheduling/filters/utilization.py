"""utilization-filter: drops the pods over any of the configured load caps."""

from __future__ import annotations

import math
from typing import Literal, Self

from pydantic import Field, model_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

UTILIZATION_FILTER_TYPE = "utilization-filter"

Metric = Literal["active-requests", "running-requests", "waiting-queue", "kv-cache-utilization"]


class Condition(PluginParams):
    #: The load measure capped.
    metric: Metric
    #: The most a pod may have and still pass.
    max_value: float = Field(ge=0.0)

    @model_validator(mode="after")
    def _fraction(self) -> Self:
        if self.metric == "kv-cache-utilization" and self.max_value > 1:
            raise ValueError(
                f"maxValue for kv-cache-utilization is a fraction and must be at most 1, "
                f"got {self.max_value}"
            )
        return self


class UtilizationFilterParams(PluginParams):
    #: The caps a pod must all meet to be kept.
    conditions: list[Condition] = Field(min_length=1)
    #: Every candidate back when all were dropped, rather than none.
    fallback_on_empty: bool = False
    #: llm-d's: the inflight-load-producer whose counts `active-requests` reads. The counts
    #: are the gateway's one in-flight ledger whichever producer is named (there is one per
    #: process), so any name reads the same.
    in_flight_load_producer_name: str = ""


@register(UTILIZATION_FILTER_TYPE, UtilizationFilterParams)
class UtilizationFilter(BasePlugin[UtilizationFilterParams]):
    """Keeps a pod only when it meets every condition (`metric <= maxValue`), so several
    conditions are several reasons to drop it: `active-requests` (requests this gateway has
    sent it and not seen end, running and queued alike: the in-flight ledger's count),
    `running-requests` and `waiting-queue` (the pod's own /metrics), `kv-cache-utilization`
    (its KV cache usage, a fraction). A pod never scraped counts zero. When every pod is
    dropped, `fallbackOnEmpty` returns them all rather than leaving the request nowhere."""

    type = UTILIZATION_FILTER_TYPE

    def __init__(self, name: str, params: UtilizationFilterParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.load = handle.load
        self._conditions = [(c.metric, c.max_value) for c in params.conditions]
        self._fallback = params.fallback_on_empty

    def value(self, endpoint: Endpoint, metric: Metric) -> float:
        if metric == "active-requests":
            return float(self.load.requests_since(endpoint.name, -math.inf))
        m = endpoint.metrics
        if metric == "running-requests":
            return float(m.running)
        if metric == "waiting-queue":
            return float(m.waiting)
        return m.kv_cache_usage

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        value, conditions = self.value, self._conditions
        kept = [e for e in endpoints if all(value(e, metric) <= cap for metric, cap in conditions)]
        if not kept and self._fallback:
            return endpoints
        return kept
