"""lora-affinity-scorer: prefers pods that have the requested LoRA adapter loaded, or room."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.datalayer.vllm_metrics import LORA_INFO
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
    model_card,
)

LORA_AFFINITY_SCORER_TYPE = "lora-affinity-scorer"


@register(LORA_AFFINITY_SCORER_TYPE)
class LoraAffinityScorer(BasePlugin[NoParams]):
    """Reads `vllm:lora_requests_info` (newest sample) for the requested model name:
    adapter running -> 1.0; room to load it (running + waiting adapters < max_lora) -> 0.8;
    adapter only waiting -> 0.6; otherwise 0.0.

    A base-model request needs no adapter slot, so every pod scores the same (0.8) for it:
    the model is a base model when the pods' /v1/models card for it has no `parent` (vLLM
    names an adapter's base model there). Ours: scored as an adapter, a base-model request
    got 0.8 on the one pod with no adapter loaded and 0.0 on pods whose adapter slots were
    full, and at weight 4 every base-model request went to that pod, a half-speed one on
    the unequal shape (p95 1.9x the oracle's; bench/RESULTS.md, "The replay on pods seen
    full, and base-model requests"). Without cards (models given in the config), as the
    reference scores."""

    type = LORA_AFFINITY_SCORER_TYPE
    metric_families = frozenset({LORA_INFO})

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        model = request.model
        # A base model's card has `parent: null`; a configured model's card has no `parent`
        # (unknown: scored as the reference does)
        card = model_card(model, endpoints)
        if card is not None and "parent" in card and card["parent"] is None:
            return DefaultScores(endpoints, 0.8, {})
        out: dict[str, float] = {}
        # A pod with no adapter at all and room for one scores 0.8, the default: only the
        # others are looked at and listed.
        others = [
            e
            for e in endpoints
            if (m := e.metrics).lora_running or m.lora_waiting or not m.max_lora > 0
        ]
        for e in others:
            m = e.metrics
            if model in m.lora_running:
                out[e.name] = 1.0
            elif len(m.lora_running) + len(m.lora_waiting) < m.max_lora:
                out[e.name] = 0.8
            elif model in m.lora_waiting:
                out[e.name] = 0.6
            else:
                out[e.name] = 0.0
        return DefaultScores(endpoints, 0.8, out)
