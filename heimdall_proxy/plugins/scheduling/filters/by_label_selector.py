"""label-selector-filter (formerly by-label-selector, still accepted): Kubernetes
label-selector matching (matchLabels + matchExpressions)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import model_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

LABEL_SELECTOR_FILTER_TYPE = "label-selector-filter"
#: llm-d's older name of the same filter, deprecated there and accepted by both.
BY_LABEL_SELECTOR_TYPE = "by-label-selector"


class LabelSelectorRequirement(PluginParams):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = []

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs a non-empty values list")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        return value is None


class ByLabelSelectorParams(PluginParams):
    match_labels: dict[str, str] = {}
    match_expressions: list[LabelSelectorRequirement] = []


@register(LABEL_SELECTOR_FILTER_TYPE, ByLabelSelectorParams, aliases=(BY_LABEL_SELECTOR_TYPE,))
class ByLabelSelectorFilter(BasePlugin[ByLabelSelectorParams]):
    """Keeps pods matching every matchLabels pair and every matchExpressions requirement
    (In, NotIn, Exists, DoesNotExist with Kubernetes semantics: NotIn also matches pods
    without the key). An empty selector keeps every pod."""

    type = LABEL_SELECTOR_FILTER_TYPE

    def __init__(self, name: str, params: ByLabelSelectorParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._pairs = tuple(params.match_labels.items())
        self._exprs = tuple(params.match_expressions)

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        return [
            e
            for e in endpoints
            if all(e.labels.get(k) == v for k, v in self._pairs)
            and all(x.matches(e.labels) for x in self._exprs)
        ]
