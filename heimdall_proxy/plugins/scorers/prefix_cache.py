"""prefix-cache-scorer: how much of a request's prompt each pod already holds, by a prefix
producer's match.

Two shapes, one type name (the factory picks by the parameters):
- llm-d's: a reader. `prefixMatchInfoProducerName` names the producer whose match it scores
  (an approx-prefix-cache-producer or a precise-prefix-cache-producer); the config loader
  fills it in with the config's approx-prefix-cache-producer when it declares one and the
  scorer names none (config/defaults.py).
- The seeds': the scorer owns an approximate index itself (`blockSizeTokens`,
  `lruCapacityPerServer`, ... on the scorer, or no producer in the config), exactly as
  approx-prefix-cache-producer keeps one, and publishes its match under its own name for the
  other readers.

Score (llm-d's): `matchLengthWeight * min(1, matched tokens / matchLengthScaleTokens)^2 +
(1 - matchLengthWeight) * matched blocks / total blocks`; the square favours long cached
prefixes, whose prefill costs grow faster than their length."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import Field
from pydantic.alias_generators import to_camel

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.prefix import (
    PrefixCacheMatchInfo,
    find_match,
    producer_match_keys,
)
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, DefaultScores, Endpoint, InferenceRequest
from heimdall_proxy.plugins.producers.approx_prefix import (
    INDEX_FIELDS,
    ApproxPrefixIndexOwner,
    IndexParams,
)

PREFIX_CACHE_SCORER_TYPE = "prefix-cache-scorer"

log = logging.getLogger(__name__)


class PrefixCacheParams(IndexParams):
    match_length_weight: float = Field(default=0.0, ge=0.0, le=1.0)
    match_length_scale_tokens: int = Field(default=8192, gt=0)
    #: The producer whose match this scorer reads; empty: the scorer owns its index (the
    #: seeds' shape), unless the config declares an approx-prefix-cache-producer.
    prefix_match_info_producer_name: str = ""

    def owns_index(self) -> bool:
        """Whether this scorer keeps its own index: it names no producer."""
        return not self.prefix_match_info_producer_name


def prefix_scores(
    info: PrefixCacheMatchInfo, endpoints: list[Endpoint], weight: float, scale: int
) -> Mapping[str, float]:
    total = info.total_blocks
    if total <= 0:
        return DefaultScores(endpoints, 0.0, {})
    # Only the pods that hold something are listed: at 1,024 pods most hold nothing (0.0).
    # Matched pods not among `endpoints` (a filter removed them) are ignored by the readers.
    if weight <= 0.0:
        return DefaultScores(
            endpoints,
            0.0,
            {pod: min(1.0, blocks / total) for pod, blocks in info.matched_blocks.items()},
        )
    size = info.block_size
    return DefaultScores(
        endpoints,
        0.0,
        {
            pod: weight * min(1.0, int(blocks) * size / scale) ** 2
            + (1.0 - weight) * min(1.0, blocks / total)
            for pod, blocks in info.matched_blocks.items()
        },
    )


class PrefixCacheScorer(ApproxPrefixIndexOwner[PrefixCacheParams]):
    """The seeds' prefix-cache-scorer: the approximate index (approx-prefix-cache-producer's
    behaviour, see ApproxPrefixIndexOwner) and the score, in one plugin."""

    type = PREFIX_CACHE_SCORER_TYPE

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        p = self.params
        info = self.match(state, request, endpoints)
        return prefix_scores(info, endpoints, p.match_length_weight, p.match_length_scale_tokens)


class PrefixCacheReader(BasePlugin[PrefixCacheParams]):
    """llm-d's prefix-cache-scorer: scores the match `prefixMatchInfoProducerName` published
    and keeps nothing (a request the producer did not match scores 0 everywhere)."""

    type = PREFIX_CACHE_SCORER_TYPE

    def __init__(self, name: str, params: PrefixCacheParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._keys = producer_match_keys(params.prefix_match_info_producer_name)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        info = find_match(state, self._keys)
        if info is None:
            return DefaultScores(endpoints, 0.0, {})
        p = self.params
        return prefix_scores(info, endpoints, p.match_length_weight, p.match_length_scale_tokens)


@register(PREFIX_CACHE_SCORER_TYPE, PrefixCacheParams)
def prefix_cache_scorer(
    name: str, params: PrefixCacheParams, handle: PluginHandle
) -> PrefixCacheScorer | PrefixCacheReader:
    """A reader of the named producer, or, in the seeds' shape, a scorer with its own index."""
    if params.owns_index():
        return PrefixCacheScorer(name, params, handle)
    ignored = sorted(INDEX_FIELDS & params.model_fields_set)
    if ignored:
        log.warning(
            "plugin %r: %s ignored: the scorer reads the index of producer %r",
            name,
            ", ".join(to_camel(f) for f in ignored),
            params.prefix_match_info_producer_name,
        )
    return PrefixCacheReader(name, params, handle)
