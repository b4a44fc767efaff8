"""latency-scorer: scores pods by the predictions of predicted-latency-producer (see
selection.py beside it for the formula), and by a composite of free KV cache, queue and
prefix match when there are none (no producer, or a model not trained yet)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.prefix import PrefixMatchParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.predicted_latency.selection import composite_scores, latency_scores
from heimdall_proxy.plugins.predicted_latency.state import read_predictions

LATENCY_SCORER_TYPE = "latency-scorer"


class LatencyScorerParams(PrefixMatchParams):
    #: With SLOs: `least` prefers the pod closest to the SLO boundary, `most` the pod with
    #: the most headroom. Without SLOs both prefer the lowest predicted latency.
    headroom_selection_strategy: Literal["least", "most"] = "least"
    #: Blend of TTFT and TPOT headroom (GIE's defaults).
    headroom_ttft_weight: float = Field(default=0.8, ge=0.0, alias="headroomTTFTWeight")
    headroom_tpot_weight: float = Field(default=0.2, ge=0.0, alias="headroomTPOTWeight")
    #: Weights of the composite fallback.
    composite_kv_weight: float = Field(default=1.0, ge=0.0, alias="compositeKVWeight")
    composite_queue_weight: float = Field(default=1.0, ge=0.0)
    composite_prefix_weight: float = Field(default=1.0, ge=0.0)


@register(LATENCY_SCORER_TYPE, LatencyScorerParams)
class LatencyScorer(BasePlugin[LatencyScorerParams]):
    """Scorer. Reads the LatencyPredictions on the CycleState; returns scores in [0, 1]."""

    type = LATENCY_SCORER_TYPE

    def __init__(self, name: str, params: LatencyScorerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._match = params.match_reader()

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        p = self.params
        preds = read_predictions(state)
        if preds is not None and preds.pods:
            scores = latency_scores(
                preds,
                endpoints,
                p.headroom_selection_strategy,
                p.headroom_ttft_weight,
                p.headroom_tpot_weight,
            )
            if scores:
                return scores
        inflight = preds.inflight if preds is not None else None
        if preds is not None:
            prefix = preds.prefix
        else:
            info = self._match(state)
            prefix = {e.name: info.ratio(e.name) for e in endpoints} if info is not None else {}
        return composite_scores(
            endpoints,
            prefix,
            p.composite_kv_weight,
            p.composite_queue_weight,
            p.composite_prefix_weight,
            inflight,
            preds,
        )
