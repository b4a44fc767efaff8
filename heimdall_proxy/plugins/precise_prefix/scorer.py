"""precise-prefix-cache-scorer (the seeds'): the precise KV-block index
(plugins/precise_prefix/producer.py) and its score in one plugin, tokenizing with its own
pool when no tokenizer ran."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.precise_prefix.params import PrecisePrefixCacheParams
from heimdall_proxy.plugins.precise_prefix.producer import PreciseIndexOwner

PRECISE_PREFIX_CACHE_SCORER_TYPE = "precise-prefix-cache-scorer"


@register(PRECISE_PREFIX_CACHE_SCORER_TYPE, PrecisePrefixCacheParams)
class PrecisePrefixCacheScorer(PreciseIndexOwner[PrecisePrefixCacheParams]):
    """Scores pods by the KV blocks they really hold (PreciseIndexOwner): per pod, the
    longest run of cached blocks from the start of the prompt, each block weighted by its
    fastest tier, over the prompt's block count, in [0, 1]; 0 for a request that could not
    be tokenized."""

    type = PRECISE_PREFIX_CACHE_SCORER_TYPE

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        info = state.get(self.state_key)
        if not isinstance(info, PrefixCacheMatchInfo):
            return {e.name: 0.0 for e in endpoints}
        return {e.name: info.ratio(e.name) for e in endpoints}
