"""no-hit-lru-scorer: spreads cold requests (no prefix-cache hit anywhere) across pods."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.prefix import (
    PREFIX_PRODUCER_TYPES,
    PrefixMatchParams,
    prefix_match_key,
)
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    AlignedScores,
    CandidateNames,
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.plugins.scheduling.scorers.shared_state import (
    SharedJournalParams,
    SharesState,
    shared_journal,
)

NO_HIT_LRU_SCORER_TYPE = "no-hit-lru-scorer"
#: Candidates from which the ranks are computed with numpy (below, its per-call cost is the
#: larger; both rank alike).
_NUMPY_FROM = 48


class NoHitLRUParams(SharedJournalParams, PrefixMatchParams):
    lru_size: int = Field(default=1024, gt=0)


@register(NO_HIT_LRU_SCORER_TYPE, NoHitLRUParams)
class NoHitLRUScorer(SharesState, BasePlugin[NoHitLRUParams]):
    """Reads the PrefixCacheMatchInfo the prefix producer `prefixMatchInfoProducerName` (else
    the seeds' `prefixPluginType` / `prefixPluginName`) left on the CycleState. A request is
    cold when no candidate holds even its first block (or when that producer left nothing).

    Cold: candidates are ranked by when they last received a cold request: pods that never
    did first (in candidate order), then the least recently used; rank r of n scores
    `1 - r / (n - 1)` (a single candidate scores 1). Hot: 0.5 everywhere, so the prefix
    scorer decides. pre_request moves the pod a cold request is sent to (and its prefill pod,
    when one ran) to the most-recent end of an LRU of `lruSize` pods, so cache growth from
    cold prompts is spread evenly. Ranks are taken among the candidates of the request.

    With `redisConfig` / `valkeyConfig` (an extension), replicas share the LRU the way
    approx-prefix-cache-producer shares its index: each move is journalled and replayed by
    the others (heimdall_proxy.replicas)."""

    type = NO_HIT_LRU_SCORER_TYPE

    def __init__(self, name: str, params: NoHitLRUParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._lru: OrderedDict[str, None] = OrderedDict()
        self._cold_key = f"{prefix_match_key(self.type, name)}#cold"
        self._match = params.match_reader()
        self.journal = shared_journal(self, params, self._apply)

    def inherit(self, previous: NoHitLRUScorer, gone: frozenset[str]) -> str | None:
        """A reload keeps the LRU, less the pods `gone`: which pods took cold requests lately
        does not depend on the parameters (a smaller `lruSize` trims it at the next one)."""
        for pod in gone:
            previous._lru.pop(pod, None)
        self._lru = previous._lru
        self.hand_over(previous)
        return None

    def _touch(self, pod: str) -> None:
        self._lru[pod] = None
        self._lru.move_to_end(pod)
        while len(self._lru) > self.params.lru_size:
            self._lru.popitem(last=False)

    def _apply(self, record: list[object]) -> None:
        """Another replica sent a cold request to the pod `record` names."""
        if record and isinstance(record[0], str) and not self.handed_over:
            self._touch(record[0])

    def check_peers(self, plugins: Mapping[str, object]) -> None:
        """The prefix producer named by prefixMatchInfoProducerName (else prefixPluginType /
        prefixPluginName) must be declared: otherwise every request would look cold,
        silently."""
        p = self.params
        if p.prefix_match_info_producer_name:
            named = plugins.get(p.prefix_match_info_producer_name)
            if named is not None and getattr(named, "type", None) in PREFIX_PRODUCER_TYPES:
                return
            what = f"prefixMatchInfoProducerName {p.prefix_match_info_producer_name!r} names"
        else:
            named = plugins.get(p.prefix_plugin_name)
            if named is not None and getattr(named, "type", None) == p.prefix_plugin_type:
                return
            what = (
                f"prefixPluginType {p.prefix_plugin_type!r} / prefixPluginName "
                f"{p.prefix_plugin_name!r} name"
            )
        prefix = [n for n, q in plugins.items() if getattr(q, "type", "") in PREFIX_PRODUCER_TYPES]
        hint = (
            f" set prefixMatchInfoProducerName: {prefix[0]}"
            if len(prefix) == 1
            else " declare a prefix producer (approx-prefix-cache-producer, ...) and name it"
        )
        raise ValueError(
            f"{what} no declared prefix producer, so every request would count as cold;{hint}"
        )

    def _is_cold(self, state: CycleState) -> bool:
        cold = state.get(self._cold_key)
        if isinstance(cold, bool):
            return cold
        info = self._match(state)
        cold = info is None or not info.has_hit()
        state[self._cold_key] = cold
        return cold

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        if not self._is_cold(state):
            return DefaultScores(endpoints, 0.5, {})
        n = len(endpoints)
        if n == 1:
            return {endpoints[0].name: 1.0}
        index = CandidateNames.of(endpoints).index() if n >= _NUMPY_FROM else None
        if index is not None:
            # the same ranks in numpy: the candidates the LRU holds, in its order, after
            # the ones it does not hold, in theirs (no dict or sort of the pool per request)
            held = [i for i in map(index.get, self._lru) if i is not None]
            unheld = np.ones(n, dtype=bool)
            unheld[held] = False
            rank = np.empty(n)
            first = np.flatnonzero(unheld)
            rank[first] = np.arange(len(first))
            rank[held] = np.arange(len(first), n)
            return AlignedScores(endpoints, (1.0 - rank / (n - 1)).tolist())
        position = {pod: i for i, pod in enumerate(self._lru)}
        never = [e.name for e in endpoints if e.name not in position]
        used = sorted((e.name for e in endpoints if e.name in position), key=position.__getitem__)
        return {pod: 1.0 - rank / (n - 1) for rank, pod in enumerate(never + used)}

    async def pre_request(self, ctx: RequestContext) -> None:
        if not self._is_cold(ctx.state):
            return
        for endpoint in (ctx.target, ctx.prefill):
            if endpoint is not None:
                self._touch(endpoint.name)
                if self.journal is not None:
                    self.journal.append([endpoint.name])

    def last_used(self) -> list[str]:
        """Pods that received cold requests, least recently first."""
        return list(self._lru)
