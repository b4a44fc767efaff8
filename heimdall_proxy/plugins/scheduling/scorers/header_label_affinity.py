"""header-label-affinity-scorer: prefers the pods whose label equals a request header (the
slice, zone or revision an earlier stage chose), without excluding the others."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import field_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, DefaultScores, Endpoint, InferenceRequest

HEADER_LABEL_AFFINITY_SCORER_TYPE = "header-label-affinity-scorer"


class HeaderLabelAffinityParams(PluginParams):
    #: The request header holding the preferred label value (any case).
    header_name: str
    #: The pod label compared with it.
    label_key: str

    @field_validator("header_name", "label_key")
    @classmethod
    def _required(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        return value


@register(HEADER_LABEL_AFFINITY_SCORER_TYPE, HeaderLabelAffinityParams)
class HeaderLabelAffinityScorer(BasePlugin[HeaderLabelAffinityParams]):
    """A pod whose label `labelKey` equals the request's `headerName` header scores 1, every
    other pod 0 (a missing header or label, or a value no pod has, scores 0 everywhere). A
    soft preference: its weight in the profile says how much it counts against the other
    scorers; one instance per header-to-label mapping gives each its own weight. It writes
    no header back: whoever coordinates the stages carries the value between them."""

    type = HEADER_LABEL_AFFINITY_SCORER_TYPE

    def __init__(self, name: str, params: HeaderLabelAffinityParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.header = params.header_name.lower()
        self.label = params.label_key

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        wanted = request.headers.get(self.header, "")
        label = self.label
        changed = {e.name: 1.0 for e in endpoints if wanted and e.labels.get(label) == wanted}
        return DefaultScores(endpoints, 0.0, changed)
