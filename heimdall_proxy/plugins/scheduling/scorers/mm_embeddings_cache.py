"""mm-embeddings-cache-scorer (llm-d's): the share of a request's media a pod likely holds
encoded."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.encoder_cache import (
    MM_EMBEDDINGS_PRODUCER_TYPE,
    EncoderCacheMatchInfo,
    match_key,
)
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

MM_EMBEDDINGS_SCORER_TYPE = "mm-embeddings-cache-scorer"


class MMEmbeddingsScorerParams(PluginParams):
    #: The mm-embeddings-cache-producer read; empty: the one of the default name.
    producer_name: str = ""


@register(MM_EMBEDDINGS_SCORER_TYPE, MMEmbeddingsScorerParams)
class MMEmbeddingsCacheScorer(BasePlugin[MMEmbeddingsScorerParams]):
    """Scores each pod with the size of the request's media items it likely holds over the
    size of all of them (every item counts 1: the share of distinct items), from the match
    mm-embeddings-cache-producer left (`producerName`, default the producer of the default
    name). A request without media, or without the producer's match, scores 0 everywhere:
    the other scorers decide."""

    type = MM_EMBEDDINGS_SCORER_TYPE

    def __init__(self, name: str, params: MMEmbeddingsScorerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.key = match_key(params.producer_name or MM_EMBEDDINGS_PRODUCER_TYPE)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        info = state.get(self.key)
        if not isinstance(info, EncoderCacheMatchInfo):
            return {}
        return {e.name: info.ratio(e.name) for e in endpoints}
