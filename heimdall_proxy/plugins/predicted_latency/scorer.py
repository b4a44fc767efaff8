"""predicted-latency-scorer: seed 000's (and GIE's) all-in-one latency plugin. It predicts
like predicted-latency-producer (it is one, with GIE's streaming default) and then chooses
the pod itself, as GIE's scorer does: score 1 for the chosen pod, 0 for the others.

The choice, in GIE's order: an affinity gate over every candidate (`affinityGateTauGlobal`,
skipped with probability `epsilonExploreSticky`); without SLOs, by predicted latency; with
SLOs, the positive tier (pods predicted to meet them) except with probability
`epsilonExploreNeg`, then the affinity gate `affinityGateTau` within the tier, then by
blended headroom (`headroomTTFTWeight`/`headroomTPOTWeight`, by `headroomSelectionStrategy`
`least`/`most`) or, in the negative tier, by blended deficit
(`negHeadroomTTFTWeight`/`negHeadroomTPOTWeight`), idle pods first. The `composite-*`
strategies weigh the tiers by the composite below instead of headroom, `composite-only`
every candidate with no tiers. The weights choose by `selectionMode`: a weighted random
draw (`linear`) or the heaviest pod (`max`). Without predictions it picks by the composite
of KV cache, queue and prefix (`composite*Weight`)."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import Duration
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.predicted_latency.producer import (
    PredictedLatencyProducer,
    PredictedLatencyProducerParams,
)
from heimdall_proxy.plugins.predicted_latency.selection import composite_scores, latency_scores
from heimdall_proxy.plugins.predicted_latency.state import LatencyPredictions, read_predictions

log = logging.getLogger(__name__)

PREDICTED_LATENCY_SCORER_TYPE = "predicted-latency-scorer"


class PredictedLatencyScorerParams(PredictedLatencyProducerParams):
    """GIE's parameters and defaults (pkg/epp/framework/plugins/scheduling/scorer/
    predictedlatency/scorer.go), plus the producer's own."""

    max_sampled_tokens: int = Field(default=5, gt=0)
    neg_headroom_ttft_weight: float = Field(default=0.8, ge=0.0, alias="negHeadroomTTFTWeight")
    neg_headroom_tpot_weight: float = Field(default=0.2, ge=0.0, alias="negHeadroomTPOTWeight")
    headroom_ttft_weight: float = Field(default=0.8, ge=0.0, alias="headroomTTFTWeight")
    headroom_tpot_weight: float = Field(default=0.2, ge=0.0, alias="headroomTPOTWeight")
    #: GIE's strategies: `least` / `most` weigh the positive tier by headroom;
    #: `composite-least` / `composite-most` weigh both tiers by the composite of KV cache,
    #: queue and prefix instead (inverted in the positive tier for `composite-least`);
    #: `composite-only` skips the tiers and weighs every candidate by the composite.
    headroom_selection_strategy: Literal[
        "least", "most", "composite-least", "composite-most", "composite-only"
    ] = "least"
    composite_kv_weight: float = Field(default=1.0, ge=0.0, alias="compositeKVWeight")
    composite_queue_weight: float = Field(default=1.0, ge=0.0)
    composite_prefix_weight: float = Field(default=1.0, ge=0.0)
    epsilon_explore_sticky: float = Field(default=0.01, ge=0.0, le=1.0)
    epsilon_explore_neg: float = Field(default=0.01, ge=0.0, le=1.0)
    affinity_gate_tau: float = Field(default=0.80, ge=0.0, le=1.0)
    affinity_gate_tau_global: float = Field(default=0.99, ge=0.0, le=1.0)
    request_timeout: Duration = Field(default=300.0, alias="contextTTL")
    #: GIE's pod selection: `linear` draws a pod at random in proportion to its weight,
    #: `max` takes the pod of the largest weight (the first of equals, in candidate order).
    selection_mode: Literal["linear", "max"] = "linear"
    streaming_mode: bool = True


@register(PREDICTED_LATENCY_SCORER_TYPE, PredictedLatencyScorerParams)
class PredictedLatencyScorer(PredictedLatencyProducer):
    """Producer, Scorer, PreRequest, ResponseStreaming, ResponseComplete, MetricsSource."""

    type = PREDICTED_LATENCY_SCORER_TYPE
    params: PredictedLatencyScorerParams

    def __init__(
        self, name: str, params: PredictedLatencyScorerParams, handle: PluginHandle
    ) -> None:
        super().__init__(name, params, handle)
        self._rng = random.Random()
        # GIE's maxSampledTokens: TPOT samples per stream, at the tokens samplingMean picks
        self._max_tpot_samples = params.max_sampled_tokens
        if "max_tpot_samples" in params.model_fields_set:
            log.warning(
                "plugin %r (type %r): parameter 'maxTPOTSamples' is not honoured here; "
                "maxSampledTokens sets the TPOT samples per stream",
                name,
                self.type,
            )

    def _gate(self, cands: list[Endpoint], preds: LatencyPredictions, tau: float) -> list[Endpoint]:
        if tau <= 0.0:
            return cands
        sticky = [e for e in cands if preds.prefix.get(e.name, 0.0) >= tau]
        if not sticky or self._rng.random() < self.params.epsilon_explore_sticky:
            return cands
        return sticky

    def _draw(self, cands: Sequence[Endpoint], weights: Mapping[str, float]) -> Endpoint:
        """The pod chosen among `cands` by `weights` (selectionMode)."""
        w = [max(weights.get(e.name, 0.0), 0.0) + 1e-3 for e in cands]
        if self.params.selection_mode == "max":
            return cands[w.index(max(w))]
        return self._rng.choices(list(cands), weights=w, k=1)[0]

    def _composite(
        self, cands: list[Endpoint], preds: LatencyPredictions, *, invert: bool = False
    ) -> Mapping[str, float]:
        p = self.params
        comp = composite_scores(
            cands,
            preds.prefix,
            p.composite_kv_weight,
            p.composite_queue_weight,
            p.composite_prefix_weight,
            preds.inflight,
            preds,
        )
        return {n: 1.0 - v for n, v in comp.items()} if invert else comp

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        if not endpoints:
            return {}
        p = self.params
        preds = read_predictions(state)
        if preds is None:  # not produced by this plugin in this cycle (a fallback cycle)
            preds = self.predict(state, request, endpoints)
        if not preds.pods:
            comp = composite_scores(
                endpoints,
                preds.prefix,
                p.composite_kv_weight,
                p.composite_queue_weight,
                p.composite_prefix_weight,
                preds.inflight,
                preds,
            )
            best = max(endpoints, key=lambda e: comp.get(e.name, 0.0))
            return {best.name: 1.0}
        cands = self._gate(list(endpoints), preds, p.affinity_gate_tau_global)
        strategy = p.headroom_selection_strategy
        if strategy == "composite-only":
            return {self._draw(cands, self._composite(cands, preds)).name: 1.0}
        if not preds.has_slo:
            return {self._draw(cands, latency_scores(preds, cands)).name: 1.0}
        weights: Mapping[str, float]
        positive = [e for e in cands if preds.pods[e.name].meets_slo]
        negative = [e for e in cands if not preds.pods[e.name].meets_slo]
        if positive and (not negative or self._rng.random() >= p.epsilon_explore_neg):
            tier = self._gate(positive, preds, p.affinity_gate_tau)
            if strategy == "least" or strategy == "most":
                weights = latency_scores(
                    preds, tier, strategy, p.headroom_ttft_weight, p.headroom_tpot_weight
                )
            else:
                weights = self._composite(tier, preds, invert=strategy == "composite-least")
        else:
            idle = [e for e in negative if preds.pods[e.name].inflight == 0]
            tier = self._gate(idle or negative, preds, p.affinity_gate_tau)
            ttft_w, tpot_w = p.neg_headroom_ttft_weight, p.neg_headroom_tpot_weight
            if not p.streaming_mode:
                ttft_w, tpot_w = 1.0, 0.0
            if strategy == "least" or strategy == "most":
                weights = latency_scores(preds, tier, "least", ttft_w, tpot_w)
            else:  # GIE weighs the negative tier composite-most for either composite strategy
                weights = self._composite(tier, preds)
        return {self._draw(tier, weights).name: 1.0}
