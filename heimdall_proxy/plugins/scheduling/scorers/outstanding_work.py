"""outstanding-work-scorer (heimdall-proxy's own): balances the work the gateway has sent each
pod, not the number of requests, so one heavy request weighs more than ten short ones."""

from __future__ import annotations

import time
from collections.abc import Mapping
from itertools import compress

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.engine_model import StepCosts, pod_speeds
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import warn_other_expiry
from heimdall_proxy.framework.params import Duration
from heimdall_proxy.framework.prefix import PrefixMatchParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CandidateNames,
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.plugins.scheduling.scorers.shared_state import (
    SharedCountsParams,
    SharesState,
    ledger_store,
    warn_ledger_alias,
)

OUTSTANDING_WORK_SCORER_TYPE = "outstanding-work-scorer"


class OutstandingWorkParams(SharedCountsParams, PrefixMatchParams):
    #: Cost of prefilling one prompt token, in units of decoding one output token. Prefill runs
    #: many tokens per forward pass, decode one per sequence per step, so a prompt token is
    #: much cheaper than an output token.
    prefill_token_weight: float = Field(default=0.2, ge=0.0)
    #: Output tokens assumed for a request that sets no limit.
    default_output_tokens: int = Field(default=256, ge=1)
    char_to_token_multiplier: float = Field(default=0.25, gt=0.0)
    request_timeout: Duration = 600.0
    #: Extension: weigh each pod's work by the time it takes there, its learned speed (the
    #: ledger's pace over an engine model's step for the batch it was seen at,
    #: framework/engine_model.py `pod_speeds`), so a pod running at half speed counts its
    #: work twice. Off: every pod's token is worth the same.
    scale_by_pod_speed: bool = False


#: The engine model a pod's speed is read against (its defaults: only the ratio between pods
#: matters here, the scores being relative to the busiest).
NOMINAL = StepCosts()

#: Seconds between two count-downs of the non-streamed requests' work (each walks them all).
DECAY_INTERVAL = 0.05


class _Work:
    __slots__ = ("decode", "decode_left", "pod", "prefill", "sent_at")

    def __init__(self, pod: str, prefill: float, decode: float, sent_at: float) -> None:
        self.pod = pod
        self.prefill = prefill
        self.decode = decode
        self.decode_left = decode
        self.sent_at = sent_at

    @property
    def total(self) -> float:
        return self.prefill + self.decode_left


@register(OUTSTANDING_WORK_SCORER_TYPE, OutstandingWorkParams)
class OutstandingWorkScorer(SharesState, BasePlugin[OutstandingWorkParams]):
    """Tracks, per pod, the work of every request this gateway has in flight there, in
    decode-token units: `prefillTokenWeight * prompt tokens` (those the pod does not already
    hold, by `prefixPluginType`/`prefixPluginName`'s match when it ran) until the response
    headers arrive (ResponseReceived; vLLM sends a stream's before prefill, see
    response_received), plus the output tokens still to come (the request's
    max_tokens / max_completion_tokens / max_output_tokens, times n, else
    `defaultOutputTokens`), counted down by one per streamed SSE event. A non-streamed
    request shows no progress until its answer: once the pod's streams have shown its pace
    (the ledger's moving averages of time to first chunk and time per output token,
    framework/pace.py), its work is
    counted down by the time it has been out at that pace (prefill gone after the time to
    first chunk, then one output token per time per token, down to one token while it runs);
    before that, it counts in full until it completes.
    Every attempt's work is removed at response_complete, which the relay runs for every
    attempt, on success, upstream failure, retry or client disconnect alike. Prompt tokens are the
    tokenizer's when one ran, else characters * charToTokenMultiplier.

    Score: `1 - work / max work` over the candidates (all idle -> 1.0), so the pod with the
    least outstanding work scores highest and the scale stays proportional. With
    `scaleByPodSpeed`, each pod's work is first multiplied by its learned speed (the ledger's
    pace read against a nominal engine, framework/engine_model.py `pod_speeds`), so work is
    compared in the time it takes on each pod.

    The work is a Measure in the gateway's ledger, so when the ledger is shared between
    gateway replicas (inflight-load-producer's `redisConfig`, replicas/ledger.py) every live
    replica's work on a pod is summed. This scorer's own `redisConfig` / `valkeyConfig`,
    from before the ledger was one, still share the ledger through that store (deprecated,
    as on active-request-scorer)."""

    type = OUTSTANDING_WORK_SCORER_TYPE

    def __init__(self, name: str, params: OutstandingWorkParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        #: The work of each attempt in flight, kept in the gateway's ledger (which drops an
        #: attempt's value when the attempt ends, expires or its pod leaves).
        self.load = handle.load
        self.inflight = self.load.measure(f"{OUTSTANDING_WORK_SCORER_TYPE}/{name}")
        warn_other_expiry(name, "requestTimeout", params.request_timeout, self.load)
        # Progress of each attempt; dropped at response_complete, which the server calls once
        # per attempt whatever happens, so it never outgrows the requests in flight.
        self._work: dict[str, _Work] = {}
        self._match = params.match_reader()
        #: The non-streamed attempts among them, counted down by time (_decay).
        self._unstreamed: dict[str, _Work] = {}
        self._next_decay = 0.0
        #: The clock of count-downs, the relay's (a test sets its own).
        self.clock = time.monotonic
        self._p = params
        self.ledger_store = ledger_store(self, params)
        if self.ledger_store is not None:
            warn_ledger_alias(self)

    def inherit(self, previous: OutstandingWorkScorer, gone: frozenset[str]) -> str | None:
        """A reload keeps the work in flight: the old requests still run (their completions,
        through the old instance, settle the same ledger, which keeps the pods' pace)."""
        self.inflight = previous.inflight
        self._work = previous._work
        self._unstreamed = previous._unstreamed
        return None

    def estimate(self, request: InferenceRequest, cached_share: float = 0.0) -> tuple[float, float]:
        """(prefill work, decode work) of a request, in decode-token units, on a pod that
        already holds `cached_share` of its prompt."""
        if request.token_ids is not None:
            prompt = float(len(request.token_ids))
        else:
            prompt = len(request.prompt_text()) * self._p.char_to_token_multiplier
        cap = request.output_cap()
        decode = float(self._p.default_output_tokens if cap is None else cap)
        return prompt * (1.0 - cached_share) * self._p.prefill_token_weight, decode

    def _cached_share(self, ctx: RequestContext) -> float:
        """Share of the prompt the target pod holds, by the prefix plugin's match (0 when it
        did not run): a cached prefix costs the pod no prefill, and counting it made pods
        serving a hot prefix look several times busier than they were."""
        info = self._match(ctx.state)
        if info is None or info.prompt_tokens <= 0:
            return 0.0
        share = info.cached_tokens(ctx.target.name) / info.prompt_tokens
        return share if share < 1.0 else 1.0

    def work(self, pod: str) -> float:
        """Outstanding work on `pod`, in decode-token units (all replicas' when shared)."""
        self._decay()
        return self.inflight.total(pod)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        self._decay()
        names = CandidateNames.of(endpoints)
        loads = self.inflight.totals_of(names.names)
        if self._p.scale_by_pod_speed and any(loads):
            loads = self._in_time(names, loads)
        top = max(loads) if loads else 0.0  # no keyword: a builtin's costs more than max
        if top <= 0.0:
            return DefaultScores(endpoints, 1.0, {})
        # An idle pod scores 1.0 - 0 / top = 1.0: only the busy ones are listed.
        return DefaultScores(
            endpoints,
            1.0,
            {e.name: 1.0 - w / top for e, w in compress(zip(endpoints, loads, strict=True), loads)},
        )

    def _in_time(self, names: CandidateNames, loads: list[float]) -> list[float]:
        """`loads` times each pod's learned speed (the candidates' mean for a pod with no
        pace yet; as they are before any). Only the busy pods' speeds are read, unless one of
        them has none: the candidates' mean walks every pace (180 us at 1,024 pods, on every
        decision)."""
        paces = self.load.paces()
        pods = names.names
        at = list(compress(range(len(loads)), loads))  # the busy candidates (few)
        busy = {pods[i]: paces[pods[i]] for i in at if pods[i] in paces}
        speeds = pod_speeds(busy, busy, NOMINAL)
        fleet = 1.0
        if len(speeds) < len(at):  # a busy pod has no speed yet
            speeds = pod_speeds(paces, names.name_set(), NOMINAL)
            if not speeds:
                return loads
            fleet = sum(speeds.values()) / len(speeds)
        timed = list(loads)
        for i in at:
            timed[i] *= speeds.get(pods[i], fleet)
        return timed

    async def pre_request(self, ctx: RequestContext) -> None:
        prefill, decode = self.estimate(ctx.request, self._cached_share(ctx))
        key = ctx.key
        work = self._work[key] = _Work(ctx.target.name, prefill, decode, ctx.started_at)
        if not ctx.request.stream:
            self._unstreamed[key] = work
        self.inflight.put(key, ctx.target.name, prefill + decode)

    async def response_received(self, ctx: RequestContext) -> None:
        # The pod's response headers. vLLM sends a stream's at once, before prefill, so this
        # drops a stream's prefill at dispatch; holding it until the first chunk (truer) was
        # measured worse with the default weights (bench/RESULTS.md, "prefill until the
        # first chunk"): the scale 1 - work / max lets long prompts' prefill crowd out the
        # decode signal.
        work = self._work.get(ctx.key)
        if work is not None and work.prefill:
            work.prefill = 0.0
            self.inflight.put(ctx.key, ctx.target.name, work.total)

    async def response_streaming(self, ctx: RequestContext, chunk: bytes) -> None:
        # Prefill went with the headers (response_received, which the relay runs first).
        work = self._work.get(ctx.key)
        events = ctx.events  # the relay counted them
        if work is not None and events and work.decode_left > 0.0:
            work.decode_left = max(0.0, work.decode_left - events)
            self.inflight.put(ctx.key, ctx.target.name, work.total)

    async def response_complete(self, ctx: RequestContext) -> None:
        key = ctx.key
        self._work.pop(key, None)
        self._unstreamed.pop(key, None)
        self.inflight.drop(key)

    def _decay(self) -> None:
        """Count down the non-streamed attempts' work by the time each has been out, at its
        pod's observed pace; at most every DECAY_INTERVAL (each call walks them all)."""
        if not self._unstreamed:
            return
        now = self.clock()
        if now < self._next_decay:
            return
        self._next_decay = now + DECAY_INTERVAL
        for key, work in self._unstreamed.items():
            pace = self.load.pace(work.pod)
            left = None if pace is None else pace.tokens_left(work.decode, now - work.sent_at)
            if left is None:
                continue  # no pace known yet, or still prefilling by it
            before = work.total
            work.prefill = 0.0
            work.decode_left = left
            if work.total != before:
                self.inflight.put(key, work.pod, work.total)
