"""by-label: keeps pods whose label value is one of the allowed values."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

BY_LABEL_TYPE = "by-label"


class ByLabelParams(PluginParams):
    label: str
    valid_values: list[str] | None = None
    allows_no_label: bool = False

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.label:
            raise ValueError("label must not be empty")
        if not self.valid_values and not self.allows_no_label:
            raise ValueError("validValues is required unless allowsNoLabel is true")
        return self


@register(BY_LABEL_TYPE, ByLabelParams)
class ByLabelFilter(BasePlugin[ByLabelParams]):
    """Keeps a pod when its `label` is in `validValues`, or when it lacks the label and
    `allowsNoLabel` is set."""

    type = BY_LABEL_TYPE

    def __init__(self, name: str, params: ByLabelParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._label = params.label
        self._valid = frozenset(params.valid_values or ())
        self._allow_missing = params.allows_no_label

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        out = []
        for e in endpoints:
            value = e.labels.get(self._label)
            if (value is None and self._allow_missing) or (
                value is not None and value in self._valid
            ):
                out.append(e)
        return out
