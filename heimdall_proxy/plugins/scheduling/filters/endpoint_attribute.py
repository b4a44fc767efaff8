"""endpoint-attribute-filter: keeps the pods whose numeric attribute, as a data-layer
extractor published it (a GPU utilization, a custom metric), passes a threshold."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Literal, Self

from pydantic import field_validator, model_validator

from heimdall_proxy.framework.attributes import (
    configured_producer,
    read_attribute,
    warn_unpublished,
)
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

ENDPOINT_ATTRIBUTE_FILTER_TYPE = "endpoint-attribute-filter"

Operator = Literal[
    "LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual", "Equal", "NotEqual"
]
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "LessThan": operator.lt,
    "LessThanOrEqual": operator.le,
    "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge,
    "Equal": operator.eq,
    "NotEqual": operator.ne,
}


class Threshold(PluginParams):
    #: How the pod's value compares with `value` to pass.
    operator: Operator
    #: The threshold.
    value: float


class FilterAlgorithm(PluginParams):
    #: llm-d plans percentile, topK and range; threshold is the one there is.
    type: Literal["threshold"]
    #: A pod passes when `<its value> <operator> <value>`.
    threshold: Threshold


class EndpointAttributeFilterParams(PluginParams):
    #: The attribute read, e.g. GPUUtilization (with `producer: dcgm-extractor`).
    attribute: str
    #: The plugin that publishes the attribute; unset: the core metrics extractor; "": an
    #: attribute published under no producer's name.
    producer: str | None = None
    #: A pod without the attribute: kept (Pass) or dropped (Fail).
    on_missing: Literal["Pass", "Fail"] = "Pass"
    #: Every candidate back when all were dropped, rather than none.
    fallback_on_empty: bool = False
    #: How the value is judged; only `threshold` exists.
    algorithm: FilterAlgorithm

    @field_validator("attribute")
    @classmethod
    def _attribute(cls, value: str) -> str:
        if not value:
            raise ValueError("attribute must not be empty")
        return value

    @field_validator("on_missing", mode="before")
    @classmethod
    def _on_missing(cls, value: object) -> object:
        return "Pass" if value == "" else value

    @model_validator(mode="after")
    def _key(self) -> Self:
        configured_producer(self.attribute, self.producer)
        return self


@register(ENDPOINT_ATTRIBUTE_FILTER_TYPE, EndpointAttributeFilterParams)
class EndpointAttributeFilter(BasePlugin[EndpointAttributeFilterParams]):
    """Keeps a pod when its attribute `attribute` (published by `producer` on the Endpoint)
    compares true against `algorithm.threshold` (`value <operator> threshold.value`). A pod
    without the attribute passes with `onMissing: Pass` (the default) and is dropped with
    `Fail`; when every pod is dropped, `fallbackOnEmpty` returns them all rather than
    leaving the request nowhere to go.

    It reads the Endpoint's attribute store, not any one extractor, so it works with
    whichever extractor fills the attribute (dcgm-extractor's GPUUtilization, ...)."""

    type = ENDPOINT_ATTRIBUTE_FILTER_TYPE

    def __init__(
        self, name: str, params: EndpointAttributeFilterParams, handle: PluginHandle
    ) -> None:
        super().__init__(name, params, handle)
        self.attribute = params.attribute
        self.producer = configured_producer(params.attribute, params.producer)
        self._pass_missing = params.on_missing == "Pass"
        self._fallback = params.fallback_on_empty
        self._compare = OPERATORS[params.algorithm.threshold.operator]
        self._value = params.algorithm.threshold.value

    def check_peers(self, plugins: Mapping[str, object]) -> None:
        warn_unpublished(self.name, self.type, self.attribute, self.producer, dict(plugins))

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        kept = []
        name, producer = self.attribute, self.producer
        compare, threshold = self._compare, self._value
        for e in endpoints:
            value = read_attribute(e, name, producer)
            if self._pass_missing if value is None else compare(value, threshold):
                kept.append(e)
        if not kept and self._fallback:
            return endpoints
        return kept
