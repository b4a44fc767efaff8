"""prefix-cache-scorer (llm-d's): how much of a request's prompt each pod already holds, by a
prefix producer's match. It keeps nothing: the index is the producer's.

`prefixMatchInfoProducerName` names the producer (an approx-prefix-cache-producer or a
precise-prefix-cache-producer); the config loader fills it in when the scorer names none
(config/defaults.py): the config's approx-prefix-cache-producer, or one made for the
scorer from the index parameters the seeds put on it (`blockSizeTokens`,
`lruCapacityPerServer`, `autoTune`, `maxPrefixBlocksToMatch`, ...).

Score (llm-d's): `matchLengthWeight * min(1, matched tokens / matchLengthScaleTokens)^2 +
(1 - matchLengthWeight) * matched blocks / total blocks`; the square favours long cached
prefixes, whose prefill costs grow faster than their length."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_reader
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, DefaultScores, Endpoint, InferenceRequest

PREFIX_CACHE_SCORER_TYPE = "prefix-cache-scorer"


class PrefixCacheParams(PluginParams):
    match_length_weight: float = Field(default=0.0, ge=0.0, le=1.0)
    match_length_scale_tokens: int = Field(default=8192, gt=0)
    #: The producer whose match this scorer reads; empty: the default-named
    #: approx-prefix-cache-producer (the loader names one when the config has it).
    prefix_match_info_producer_name: str = ""


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


@register(PREFIX_CACHE_SCORER_TYPE, PrefixCacheParams)
class PrefixCacheScorer(BasePlugin[PrefixCacheParams]):
    """Scores, in [0, 1], the match `prefixMatchInfoProducerName` published for the request;
    a request the producer did not match (too short, or the producer did not run) scores 0
    everywhere. Two scorers that name the same producer read one index."""

    type = PREFIX_CACHE_SCORER_TYPE

    def __init__(self, name: str, params: PrefixCacheParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._match = prefix_match_reader(params.prefix_match_info_producer_name)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        info = self._match(state)
        if info is None:
            return DefaultScores(endpoints, 0.0, {})
        p = self.params
        return prefix_scores(info, endpoints, p.match_length_weight, p.match_length_scale_tokens)
