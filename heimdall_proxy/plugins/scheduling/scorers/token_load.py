"""token-load-scorer (llm-d's): fewer tokens in flight on a pod, higher score."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

TOKEN_LOAD_SCORER_TYPE = "token-load-scorer"
#: 128 requests of 32K tokens (llm-d's default); a value <= 0 means this.
DEFAULT_QUEUE_THRESHOLD_TOKENS = 4_194_304

log = logging.getLogger(__name__)


class TokenLoadParams(PluginParams):
    queue_threshold_tokens: int = DEFAULT_QUEUE_THRESHOLD_TOKENS
    in_flight_load_producer_name: str = ""


@register(TOKEN_LOAD_SCORER_TYPE, TokenLoadParams)
class TokenLoadScorer(BasePlugin[TokenLoadParams]):
    """Scores each candidate `1 - min(1, tokens / queueThresholdTokens)`, where tokens are
    those the gateway's in-flight ledger holds for the pod (uncached prompt tokens until a
    stream's first chunk, plus estimated output with inflight-load-producer's
    `addEstimatedOutputTokens`): an idle pod scores 1, one at the threshold or above 0.
    Reads the ledger and keeps nothing of its own."""

    type = TOKEN_LOAD_SCORER_TYPE

    def __init__(self, name: str, params: TokenLoadParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        threshold = params.queue_threshold_tokens
        self._threshold = float(threshold if threshold > 0 else DEFAULT_QUEUE_THRESHOLD_TOKENS)
        if params.in_flight_load_producer_name:
            log.warning(
                "%s: inFlightLoadProducerName %r is not needed: the gateway keeps one in-flight "
                "ledger, which every inflight-load-producer configures",
                name,
                params.in_flight_load_producer_name,
            )
        self.load = handle.load
        self.load.count_tokens = True

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        tokens = self.load.tokens
        top = self._threshold
        out = {}
        for e in endpoints:
            n = tokens.get(e.name, 0)
            out[e.name] = 1.0 - n / top if n < top else 0.0
        return out
