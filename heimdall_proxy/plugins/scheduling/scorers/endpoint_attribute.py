"""endpoint-attribute-scorer: ranks pods by a numeric attribute a data-layer extractor
published (a GPU utilization, a queue depth), normalised linearly."""

from __future__ import annotations

from collections.abc import Mapping
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

ENDPOINT_ATTRIBUTE_SCORER_TYPE = "endpoint-attribute-scorer"


class FixedRange(PluginParams):
    #: The value that scores 0 (1 when lower is better); must be below `max`.
    min: float = 0.0
    #: The value that scores 1 (0 when lower is better).
    max: float = 0.0


class AdaptiveRange(PluginParams):
    pass


class Normalization(PluginParams):
    """At most one strategy; neither means adaptiveRange."""

    #: Known bounds (e.g. [0, 1] for a utilization); values outside are clamped.
    fixed_range: FixedRange | None = None
    #: The candidates' own smallest and largest values (the default).
    adaptive_range: AdaptiveRange | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if self.fixed_range is not None and self.adaptive_range is not None:
            raise ValueError(
                "at most one normalization strategy, got both fixedRange and adaptiveRange"
            )
        fixed = self.fixed_range
        if fixed is not None and fixed.min >= fixed.max:
            raise ValueError(
                f"normalization.fixedRange requires min < max, got min {fixed.min}, max {fixed.max}"
            )
        return self


class ScorerAlgorithm(PluginParams):
    #: Which end of the range scores 1.
    type: Literal["linear_lower_is_better", "linear_higher_is_better"]
    #: Where the range comes from: at most one of fixedRange and adaptiveRange.
    normalization: Normalization = Normalization()


class EndpointAttributeScorerParams(PluginParams):
    #: The attribute read, e.g. GPUUtilization (with `producer: dcgm-extractor`).
    attribute_key: str
    #: The plugin that publishes the attribute; unset: the core metrics extractor; "": an
    #: attribute published under no producer's name.
    producer: str | None = None
    #: How the value becomes a score.
    algorithm: ScorerAlgorithm

    @field_validator("attribute_key")
    @classmethod
    def _attribute(cls, value: str) -> str:
        if not value:
            raise ValueError("attributeKey must not be empty")
        return value

    @model_validator(mode="after")
    def _key(self) -> Self:
        configured_producer(self.attribute_key, self.producer)
        return self


@register(ENDPOINT_ATTRIBUTE_SCORER_TYPE, EndpointAttributeScorerParams)
class EndpointAttributeScorer(BasePlugin[EndpointAttributeScorerParams]):
    """Scores a pod `(value - min) / (max - min)` of its attribute `attributeKey`
    (published by `producer` on the Endpoint), inverted for `linear_lower_is_better`.

    The range: `fixedRange` (known bounds, e.g. a utilization in [0, 1]; values outside are
    clamped) or, by default, `adaptiveRange`: the smallest and largest value among this
    request's candidates (open-ended values such as a queue depth); when all the pods that
    have the attribute share one value they all score 1.0, a neutral tie. A pod without the
    attribute scores 0 and takes no part in the range.

    It reads the Endpoint's attribute store, not any one extractor, so it works with
    whichever extractor fills the attribute."""

    type = ENDPOINT_ATTRIBUTE_SCORER_TYPE

    def __init__(
        self, name: str, params: EndpointAttributeScorerParams, handle: PluginHandle
    ) -> None:
        super().__init__(name, params, handle)
        self.attribute = params.attribute_key
        self.producer = configured_producer(params.attribute_key, params.producer)
        self._lower_better = params.algorithm.type == "linear_lower_is_better"
        self._fixed = params.algorithm.normalization.fixed_range

    def check_peers(self, plugins: Mapping[str, object]) -> None:
        warn_unpublished(self.name, self.type, self.attribute, self.producer, dict(plugins))

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        values = {}
        name, producer = self.attribute, self.producer
        for e in endpoints:
            value = read_attribute(e, name, producer)
            if value is not None:
                values[e.name] = value
        scores = dict.fromkeys((e.name for e in endpoints), 0.0)
        if not values:
            return scores
        if self._fixed is not None:
            low, high = self._fixed.min, self._fixed.max
        else:
            low, high = min(values.values()), max(values.values())
            if low == high:
                scores.update(dict.fromkeys(values, 1.0))
                return scores
        for pod, value in values.items():
            norm = min(1.0, max(0.0, (value - low) / (high - low)))
            scores[pod] = 1.0 - norm if self._lower_better else norm
        return scores
