"""prefix-cache-affinity-filter: stay on the pods that hold the prompt's prefix, until they
are busy enough that a cold pod would answer sooner.

Pure prefix affinity piles a hot prefix onto the one pod that holds it (the "death spiral":
its queue grows while the other pods idle). This filter keeps the affinity only while it
pays: it estimates each candidate's time to first token from the prompt tokens this gateway
has in flight there plus the prompt tokens the pod would have to compute for this request,
and releases the narrowing when the best pod holding the prefix would answer more than
`maxTTFTPenaltyMs` later than the best pod that does not. The released prefix then lands
where the scorers send it (the least loaded pod, with a load scorer in the profile), which
warms up and becomes sticky in turn, so a hot prefix spreads over as many pods as its load
needs, and no more."""

from __future__ import annotations

import math
import random
from typing import Any

from pydantic import Field

from heimdall_proxy.datalayer.vllm_metrics import LORA_INFO
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import warn_other_expiry
from heimdall_proxy.framework.inherit import changed
from heimdall_proxy.framework.params import Duration
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_reader
from heimdall_proxy.framework.queue_price import QueuePrice
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CandidateNames,
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.plugins.prefix_affinity import trace as affinity_trace
from heimdall_proxy.plugins.scheduling.scorers.shared_state import (
    SharedCountsParams,
    SharedJournalParams,
    SharesState,
    ledger_store,
    shared_journal,
)
from heimdall_proxy.replicas.ledger import share_of

PREFIX_CACHE_AFFINITY_FILTER_TYPE = "prefix-cache-affinity-filter"


class PrefixCacheAffinityParams(SharedCountsParams, SharedJournalParams):
    #: A pod is sticky when it holds at least this fraction of the prompt's blocks (the
    #: reference's default).
    affinity_threshold: float = Field(default=0.80, ge=0.0, le=1.0)
    #: How much later (ms) the best sticky pod may answer than the best other pod before the
    #: narrowing is released; 0 releases as soon as a cold pod would answer first. The
    #: default (ours) is two 1600-token prompts at the default throughput: a warm pod keeps
    #: its prefix until it is about two prompts busier than the idlest cold pod.
    max_ttft_penalty_ms: float = Field(default=200.0, ge=0.0, alias="maxTTFTPenaltyMs")
    #: Release only when the best sticky pod's estimate also exceeds the best other pod's by
    #: this fraction of the latter. The estimate counts work queued ahead, and its error grows
    #: with the queue (how long those requests will decode is a guess), so under deep
    #: saturation a fixed margin releases on noise: every pod is minutes deep, moving saves
    #: nothing, and each move costs the prefix on a new pod. 0 (the default) keeps the
    #: absolute margin alone.
    max_ttft_penalty_ratio: float = Field(default=0.0, ge=0.0, alias="maxTTFTPenaltyRatio")
    #: Prompt tokens one pod prefills per second. Calibrate per model and hardware (as
    #: llm-d's calibration recipe does); the default is ours, about what the simulator and
    #: a mid-size model on one H100 do.
    peak_prefill_throughput: float = Field(default=16000.0, gt=0.0)
    #: Take the wait for what is in flight on a pod from what the in-flight ledger learned
    #: there from streamed responses' first tokens (framework/queue_price.py: a price per
    #: prompt token beyond the pod's free depth, or a replay of its slots) rather than at
    #: `peakPrefillThroughput`, which then prices only the request's own prefill. Pods that
    #: make requests wait for a decode slot delay a first token by a whole reply per request
    #: ahead, several times its prefill, and not at all while a slot is free.
    learn_queue_delay: bool = True
    #: Release a prefix that many recent requests shared at a smaller margin: when n recent
    #: requests (decayed, this one included) shared the longest prefix a sticky pod holds,
    #: the margin is divided by n ** sharedPrefixDiscount. A pod a shared system prompt
    #: moves to is warm for all its later requests, while a conversation's history (n = 1)
    #: keeps the whole margin (see framework/popularity.py). Ours; the default 0 gives every
    #: prefix the same margin (config/recommended.yaml sets 0.75).
    shared_prefix_discount: float = Field(default=0.0, ge=0.0)
    #: Requests over which that count decays by half.
    popularity_half_life: float = Field(default=64.0, gt=0.0)
    #: Probability of not narrowing a request at all, so pods outside the sticky set keep
    #: seeing some of the prefix's traffic.
    exploration_probability: float = Field(default=0.0, ge=0.0, le=1.0)
    #: The prefix-cache plugin whose match information is read.
    prefix_plugin_type: str = "prefix-cache-scorer"
    prefix_plugin_name: str = "prefix-cache-scorer"
    #: Token estimate for requests that were not tokenized (characters per token).
    char_to_token_multiplier: float = Field(default=0.25, gt=0.0)
    #: A request in flight longer than this stops counting (its end was never seen).
    request_timeout: Duration = 600.0
    #: Extension, with `redisConfig`: journal entries of queue-delay samples kept for
    #: replicas that start later. The price weighs the last few dozen samples most
    #: (framework/queue_delay.py), so a short history is enough.
    history_entries: int = Field(default=1000, gt=0)


@register(PREFIX_CACHE_AFFINITY_FILTER_TYPE, PrefixCacheAffinityParams)
class PrefixCacheAffinityFilter(SharesState, BasePlugin[PrefixCacheAffinityParams]):
    """Filter, PreRequest, ResponseStreaming, ResponseComplete.

    Filter: reads the PrefixCacheMatchInfo of `prefixPluginType`/`prefixPluginName`. When
    some candidates but not all hold at least `affinityThreshold` of the prompt, keeps only
    those, unless (release) the best of them has an estimated TTFT more than
    `maxTTFTPenaltyMs` above the best other candidate's, or the request is drawn for
    exploration (`explorationProbability`). Estimated TTFT of a pod = (prompt tokens of the
    requests this gateway has in flight there + the prompt tokens this request would not
    find cached there) / `peakPrefillThroughput`; with `learnQueueDelay`, the wait for what
    is in flight is the ledger's learned one instead: the tokens beyond the pod's free depth
    (the requests it runs without delaying the next) at the delay they were seen to cause
    there, or, on a pod seen to queue behind its slots, a replay of those slots from the ages
    of its requests and its service time (framework/queue_delay.py, service_time.py).
    A cold request (no pod reaches the threshold) is not narrowed. With
    `sharedPrefixDiscount` (ours), the margin shrinks for a prefix many recent requests
    shared.

    The filter learns nothing itself; it reads what the gateway's owners keep (one per
    process, carried over reloads, forgetting pods that leave): the prompt tokens in flight
    and the queue price from the in-flight ledger (`handle.load`, framework/queue_price.py:
    fed by the request path from each streamed attempt's first chunk), and the prefix
    popularity (`handle.popularity`, framework/popularity.py), which its pre_request counts
    each sent request into under the prefix its filtering priced.

    The prompt tokens in flight per pod are the gateway's in-flight ledger's whole prompts
    (framework/inflight.py), counted from dispatch until the response ends: a pod busy
    decoding requests whose prompts it had cached still counts as busy, which is what stops a
    hot prefix from piling onto it. The filter keeps no count of its own; `requestTimeout`
    is the ledger's expiry (600s), warned about when set otherwise.

    With `redisConfig` / `valkeyConfig` (an extension), the prompt tokens in flight are those
    of every live gateway replica, shared as active-request-scorer shares its counts
    (heimdall_proxy.replicas); without it, a replica sees only its own share and releases a
    hot prefix too late. The queue price is then learned from every replica's first tokens
    too (a journal of samples): each replica learning from its own half alone priced the same
    pod up to 15% apart from the other and from a single gateway, enough to flip a keep or
    release decision now and then (bench/RESULTS.md, "decision trace"): this filter's store
    carries the ledger's price samples (its journal). The requests the prefix popularity
    counts are every replica's too (`sharedPrefixDiscount`, riding on the counters'
    pushes)."""

    type = PREFIX_CACHE_AFFINITY_FILTER_TYPE
    #: The queue price it reads takes a pod's slots from its scrapes, and needs the adapters
    #: waiting there to tell a wait for an adapter slot from a wait for a slot.
    metric_families = frozenset({LORA_INFO})

    def __init__(self, name: str, params: PrefixCacheAffinityParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        #: The gateway's in-flight ledger: the whole prompts in flight on each pod (`prompts`),
        #: which the relay counts from dispatch to the end.
        self.load = handle.load
        self.load.count_tokens = True
        warn_other_expiry(name, "requestTimeout", params.request_timeout, self.load)
        self._rng = random.Random()
        self._seconds_per_token = 1.0 / params.peak_prefill_throughput
        self._penalty = params.max_ttft_penalty_ms / 1000.0
        #: Its store shares the gateway's ledger too (replicas/ledger.py): the prompts in
        #: flight it reads are then every replica's.
        self.ledger_store = ledger_store(self, params)
        #: The ledger's queue price (read only: the ledger learns it); None: the queue is
        #: priced at `peakPrefillThroughput`.
        self.queue_price: QueuePrice | None = None
        if params.learn_queue_delay:
            self.queue_price = self.load.queue_price(self._seconds_per_token)
            self.journal = shared_journal(self, params, self._learned)
        #: The gateway's prefix popularity (read, and fed with the requests this filter
        #: priced). With sharing, it counts every replica's requests (the others' ride on the
        #: counters' pushes), as one gateway's would.
        self.popularity = handle.popularity.of(params.popularity_half_life)
        if self.ledger_store is not None and params.shared_prefix_discount:
            self.popularity.riding = True
            self.ledger_rider = self.popularity
        # the attempt whose first-token sample was traced last (trace output only)
        self._traced: str | None = None
        # CycleState key of the shared prefix the filter priced, counted when the request
        # is sent (pre_request), so retries' and the debug route's filtering count nothing
        self._shared_prefix_key = f"{PREFIX_CACHE_AFFINITY_FILTER_TYPE}/{name}#prefix"
        # CycleState key of the prefix plugin's match (made once, not per request)
        self._match_reader = prefix_match_reader(
            "", params.prefix_plugin_type, params.prefix_plugin_name
        )

    def inherit(self, previous: PrefixCacheAffinityFilter, gone: frozenset[str]) -> str | None:
        """What it reads outlives the reload in its owners (the ledger's queue price, the
        gateway's prefix popularity); this says when the parameters select another one
        (`peakPrefillThroughput`, the price's starting point; `popularityHalfLife`), and
        takes over the sharing: from now on the price's samples go out through this
        filter's journal, and the counters' pushes carry the popularity."""
        not_kept: list[str] = []
        if self.queue_price is not None:
            if previous.queue_price is not self.queue_price:
                reason = changed(previous.params, self.params, "peak_prefill_throughput")
                not_kept.append(f"the queue price is learned anew: {reason or 'learnQueueDelay'}")
            self.queue_price.share(self.journal)
        if previous.popularity is not self.popularity:
            reason = changed(previous.params, self.params, "popularity_half_life")
            not_kept.append(f"the prefix popularity is counted anew: {reason}")
        self.hand_over(previous)
        return "; ".join(not_kept) or None

    async def start(self) -> None:
        # The first filter to share the price attaches its journal before joining, so the
        # samples the journal replays (kept for replicas that start later) are learned; on a
        # reload the predecessor's stays attached until `inherit` (the replay is the samples
        # the price already has).
        price = self.queue_price
        if price is not None and self.journal is not None and price.journal is None:
            price.share(self.journal)
        await super().start()

    async def stop(self) -> None:
        price = self.queue_price
        if price is not None and self.journal is not None and price.journal is self.journal:
            price.share(None)
        await super().stop()

    def _learned(self, record: list[Any]) -> None:
        """Another replica's queue-price sample, applied to the ledger's price by the journal
        attached to it (one, so a reload's two filters do not learn it twice)."""
        price = self.queue_price
        if price is not None and price.journal is self.journal:
            price.learned(record)

    def _match(self, state: CycleState) -> PrefixCacheMatchInfo | None:
        return self._match_reader(state)

    def _prompt_tokens(self, request: InferenceRequest) -> int:
        if request.token_ids is not None:
            return len(request.token_ids)
        return int(len(request.prompt_text()) * self.params.char_to_token_multiplier)

    def estimated_ttft(
        self, pod: str, info: PrefixCacheMatchInfo | None, prompt_tokens: int
    ) -> float:
        """Seconds until `pod` could answer a request of `prompt_tokens` (info: what it
        holds of it), from the prompt tokens this gateway has in flight there."""
        own = info.uncached_tokens(pod) if info is not None else prompt_tokens
        return self._wait(pod) + own * self._seconds_per_token

    def _busy(self, pod: str) -> float:
        """Prompt tokens in flight on `pod` (every replica's, when shared)."""
        return float(self.load.prompts.get(pod, 0))

    def _wait(self, pod: str) -> float:
        """Seconds a request sent to `pod` now waits for what is in flight there: by the
        ledger's learned price and free depth (a pod running several requests at once delays
        nobody until they fill it), else at `peakPrefillThroughput`."""
        if self.queue_price is None:
            return self._busy(pod) * self._seconds_per_token
        requests = self.load.requests.get(pod, 0)
        if not requests:  # nothing in flight there: no wait (and no lookups, at 1,024 pods)
            return 0.0
        return self.queue_price.wait(pod, self._busy(pod), requests, self.load.keys_on(pod))

    def _queue_price(self, pod: str) -> float:
        """Seconds of delay per prompt token in flight on `pod`."""
        if self.queue_price is None:
            return self._seconds_per_token
        return self.queue_price.price(pod)

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        info = self._match(state)
        if info is None or len(endpoints) < 2:
            return endpoints
        threshold = self.params.affinity_threshold
        held = info.matched_blocks  # the pods that hold anything: few, at any pool size
        index = CandidateNames.of(endpoints).index()
        if index is None:  # two candidates share a name (not in a pool): look at each
            sticky = [
                e
                for e in endpoints
                if e.name in held and (r := info.ratio(e.name)) > 0.0 and r >= threshold
            ]
        else:  # the same pods, in candidate order, found from the few that hold anything
            at = sorted(
                i
                for pod in held
                if (i := index.get(pod)) is not None
                and (r := info.ratio(pod)) > 0.0
                and r >= threshold
            )
            sticky = [endpoints[i] for i in at]
        prefix = None
        if sticky and self.params.shared_prefix_discount:
            prefix = self._shared_prefix(state, info, sticky)
        if not sticky or len(sticky) == len(endpoints):
            return endpoints
        p = self.params.exploration_probability
        if p and self._rng.random() < p:
            return endpoints
        prompt = info.prompt_tokens or self._prompt_tokens(request)
        names = {e.name for e in sticky}
        best_sticky = min(self.estimated_ttft(e.name, info, prompt) for e in sticky)
        best_other = min(
            self.estimated_ttft(e.name, info, prompt) for e in endpoints if e.name not in names
        )
        margin = self._penalty + self.params.max_ttft_penalty_ratio * best_other
        if prefix is not None:  # n ** sharedPrefixDiscount, this request included
            n = self.popularity.count(prefix) + 1.0
            margin /= math.pow(n, self.params.shared_prefix_discount)
        released = best_sticky > best_other + margin
        if affinity_trace.enabled():
            self._trace_filter(request, info, prompt, endpoints, names, released, margin)
        if released:
            return endpoints  # released: the prefix spreads to where the scorers send it
        return sticky

    def _replica(self) -> str:
        counters = share_of(self.load).counters
        return counters.replica if counters is not None else ""

    def _trace_filter(
        self,
        request: InferenceRequest,
        info: PrefixCacheMatchInfo,
        prompt: int,
        endpoints: list[Endpoint],
        sticky: set[str],
        released: bool,
        margin: float,
    ) -> None:
        pods = [e.name for e in endpoints]
        est = {p: self.estimated_ttft(p, info, prompt) for p in pods}
        local = {p: float(self.load.own_prompts.get(p, 0)) for p in pods}
        others = {p: self.load.prompts.get(p, 0) - local[p] for p in pods}
        price = {p: self._queue_price(p) for p in pods}
        affinity_trace.emit(
            "filter",
            request.request_id,
            self._replica(),
            sticky=sorted(sticky),
            released=released,
            margin=margin,
            view=affinity_trace.view(pods, local, others, price, est),
        )

    def _shared_prefix(
        self, state: CycleState, info: PrefixCacheMatchInfo, sticky: list[Endpoint]
    ) -> int | None:
        """The key of the longest prefix a sticky pod holds (what a move would give up), left
        on `state` for pre_request to count when the request is sent."""
        depth = max(int(info.matched_blocks.get(e.name, 0.0)) for e in sticky)
        if not 0 < depth <= len(info.block_keys):
            return None
        key = info.block_keys[depth - 1]
        state[self._shared_prefix_key] = key
        return key

    async def pre_request(self, ctx: RequestContext) -> None:
        info = self._match(ctx.state)
        tokens = info.prompt_tokens if info is not None and info.prompt_tokens else 0
        tokens = tokens or self._prompt_tokens(ctx.request)
        pod, key = ctx.target.name, ctx.key
        if self.params.shared_prefix_discount:
            prefix = ctx.state.get(self._shared_prefix_key)
            self.popularity.observe(prefix if isinstance(prefix, int) else None, key)
        if affinity_trace.enabled():
            affinity_trace.emit("start", key, self._replica(), pod=pod, tokens=tokens)

    async def response_streaming(self, ctx: RequestContext, chunk: bytes) -> None:
        """Trace only: the queue-price sample the ledger took at this stream's first chunk."""
        price = self.queue_price
        if price is None or price.last is None or not affinity_trace.enabled():
            return
        key, pod, ahead, delay = price.last
        if key == ctx.key and key != self._traced:
            self._traced = key
            affinity_trace.emit("first", key, self._replica(), pod=pod,
                                ahead=ahead, delay=delay)  # fmt: skip

    async def response_complete(self, ctx: RequestContext) -> None:
        key = ctx.key
        if affinity_trace.enabled():
            affinity_trace.emit("end", key, self._replica(), pod=ctx.target.name)
