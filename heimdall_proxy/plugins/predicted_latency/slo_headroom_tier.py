"""slo-headroom-tier-filter: keep the pods predicted to meet the request's SLO (the positive
tier), except for a small share of requests sent to the others (the negative tier), so a pod
that was overloaded gets a chance to show it has recovered and its predictions follow.
A no-op without SLO headers or predictions, or when every pod is in one tier."""

from __future__ import annotations

import random

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.predicted_latency.state import read_predictions

SLO_HEADROOM_TIER_FILTER_TYPE = "slo-headroom-tier-filter"


class SLOHeadroomTierParams(PluginParams):
    #: Probability of sending a request to the negative tier when both tiers are non-empty
    #: (GIE's epsilonExploreNeg default).
    epsilon_explore_neg: float = Field(default=0.01, ge=0.0, le=1.0)


@register(SLO_HEADROOM_TIER_FILTER_TYPE, SLOHeadroomTierParams)
class SLOHeadroomTierFilter(BasePlugin[SLOHeadroomTierParams]):
    """Filter. Reads the LatencyPredictions on the CycleState; returns the positive or (with
    probability epsilonExploreNeg) the negative tier, order preserved."""

    type = SLO_HEADROOM_TIER_FILTER_TYPE

    def __init__(self, name: str, params: SLOHeadroomTierParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._rng = random.Random()

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        preds = read_predictions(state)
        if preds is None or not preds.has_slo or not preds.pods:
            return endpoints
        positive: list[Endpoint] = []
        negative: list[Endpoint] = []
        for e in endpoints:
            p = preds.pods.get(e.name)
            (positive if p is None or p.meets_slo else negative).append(e)
        if not positive or not negative:
            return endpoints
        if self._rng.random() < self.params.epsilon_explore_neg:
            return negative
        return positive
