"""finish-time-scorer (heimdall-proxy's own): prefers the pod where the request would finish
first, in seconds, by what the gateway has in flight there.

The load scorers count work (requests, tokens); this one turns the in-flight ledger's view of
each pod into time (framework/finish_time.py): when a slot frees for the request, given what
each request ahead has left, plus the request's own prefill of what the pod does not hold and
its output at the pod's pace. That is what tells a full pod whose requests are about to end
from one whose requests just began, a pod that decodes at half speed from a fast one with the
same work, and a pod whose adapter slots are taken by another LoRA adapter from one that has
this request's (bench/RESULTS.md, "Finish time").

It keeps nothing of its own: the attempts in flight, each pod's pace (time per output token,
from the streams that ran to their end there) and each pod's free depth (how many requests it
runs at once, learned from first tokens by the queue price) are the ledger's; the adapter
slots and the resident adapters are the pods' `vllm:lora_requests_info`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from pydantic import Field

from heimdall_proxy.datalayer.vllm_metrics import LORA_INFO
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.finish_time import Ahead, finish_time
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import Attempt
from heimdall_proxy.framework.pace import Pace
from heimdall_proxy.framework.prefix import PrefixMatchParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CandidateNames,
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
)

FINISH_TIME_SCORER_TYPE = "finish-time-scorer"


class FinishTimeParams(PrefixMatchParams):
    #: Prompt tokens a pod prefills per second: what a prompt it does not hold costs, and where
    #: the ledger's learned free depth starts from (prefix-cache-affinity-filter's parameter
    #: of the same name and default; equal values share one learned queue).
    peak_prefill_throughput: float = Field(default=16000.0, gt=0.0)
    #: Output tokens assumed for a request that sets no limit.
    default_output_tokens: int = Field(default=256, ge=1)


@register(FINISH_TIME_SCORER_TYPE, FinishTimeParams)
class FinishTimeScorer(BasePlugin[FinishTimeParams]):
    """Per candidate, the seconds until the request would finish there
    (framework/finish_time.py), from the ledger (handle.load):

    - the requests this gateway has in flight on the pod, oldest first, each with its
      uncached prompt still to prefill until its first chunk (at `peakPrefillThroughput`)
      and its output limit (max_tokens, ...; else `defaultOutputTokens`) less the events
      streamed, at the pod's time per output token;
    - how many the pod runs at once, once it was seen to queue: one more than its learned
      free depth, and never fewer than this gateway's requests seen streaming there at once
      (the queue price's `slots`, framework/queue_price.py); before that, all of them, so the
      wait is 0 and the load scorers carry the load;
    - the request's own prefill of what the pod does not hold (by the prefix match) and its
      output limit at the pod's pace;
    - a LoRA request on a pod whose adapter slots (`max_lora`) hold other adapters in use
      waits for them.

    A pod's pace is its own once a stream there ran to its end, else the fleet's mean; while
    no pod has one, every pod scores 1.0 (nothing to price output with). Score: the earliest
    finish over this pod's, so the pod that finishes first scores 1.0 and one that takes
    twice as long 0.5.

    Only this replica's requests are seen when the ledger is shared between replicas (their
    attempts are not published); the others' still count through the load scorers."""

    type = FINISH_TIME_SCORER_TYPE
    metric_families = frozenset({LORA_INFO})

    def __init__(self, name: str, params: FinishTimeParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.load = handle.load
        self._seconds_per_token = 1.0 / params.peak_prefill_throughput
        #: The ledger's queue price at this rate: each pod's learned free depth (reading it
        #: makes the relay count each attempt's uncached prompt, which is priced here too).
        self.queue = self.load.queue_price(self._seconds_per_token)
        self._match = params.match_reader()
        #: The clock the ages of non-streamed requests are read with (a test sets its own).
        self.clock = time.monotonic

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        load = self.load
        fleet = load.fleet_tpot()
        if fleet is None:
            return DefaultScores(endpoints, 1.0, {})
        info = self._match(state)
        prompt = info.prompt_tokens if info is not None else request.estimated_tokens()
        cap = request.output_cap()
        output = self.params.default_output_tokens if cap is None else cap
        spt = self._seconds_per_token
        # Most pods of a large pool are idle and hold none of the prompt: each finishes at its
        # own pace (the fleet's while it has none), and only the busy ones are replayed.
        base = prompt * spt
        usual = base + output * fleet
        names = CandidateNames.of(endpoints)
        candidates = names.name_set()
        finish = {
            pod: base + output * pace.tpot
            for pod, pace in load.paces().items()
            if pace.tpot is not None and pod in candidates
        }
        if info is not None:
            for pod in info.matched_blocks.keys() & candidates:
                finish[pod] = finish.get(pod, usual) - info.cached_tokens(pod) * spt
        busy = load.busy_own_pods() & candidates
        if busy:
            self._replay(busy, endpoints, names, finish, usual, fleet, request.model)
        best = min(finish.values(), default=usual)
        if len(finish) < len(names.names) and usual < best:
            best = usual
        return DefaultScores(
            endpoints,
            best / usual if usual > 0.0 else 1.0,
            {pod: best / t if t > 0.0 else 1.0 for pod, t in finish.items()},
        )

    def _replay(
        self,
        busy: Iterable[str],
        endpoints: list[Endpoint],
        names: CandidateNames,
        finish: dict[str, float],
        usual: float,
        fleet: float,
        model: str,
    ) -> None:
        """The `busy` candidates' finish for a request for `model`: their own (in `finish`,
        else `usual`) after the wait for what is in flight there."""
        load = self.load
        adapters = _adapters(endpoints)
        adapter = model if model in adapters else ""
        now = self.clock()
        index = names.index()
        by_name = index if index is not None else {e.name: i for i, e in enumerate(endpoints)}
        for pod in busy:
            pace = load.pace(pod)
            tpot = pace.tpot if pace is not None and pace.tpot is not None else fleet
            ahead = self._ahead(load.attempts_on(pod), tpot, pace, adapters, now)
            slots = self.queue.slots(pod)
            max_lora = endpoints[by_name[pod]].metrics.max_lora
            finish[pod] = finish_time(ahead, finish.get(pod, usual), slots, adapter, max_lora)

    def _ahead(
        self,
        attempts: Iterable[Attempt],
        tpot: float,
        pace: Pace | None,
        adapters: frozenset[str],
        now: float,
    ) -> list[Ahead]:
        """The requests in flight on a pod, oldest first, as seconds of work left: a stream's
        output less its events so far; a request not streamed shows none until its answer,
        so its output is counted down by its age at the pod's pace (as outstanding-work-
        scorer does), down to one token while it runs."""
        spt, default = self._seconds_per_token, self.params.default_output_tokens
        out = []
        for a in attempts:
            ctx = a.ctx
            if ctx is None:  # a disaggregated hop: its prefill alone
                out.append(Ahead(a.prompt * spt, ""))
                continue
            request = ctx.request
            cap = request.output_cap()
            total = float(default if cap is None else cap)
            if request.stream:
                left = max(1.0, total - ctx.events_seen)
            else:
                by_pace = None if pace is None else pace.tokens_left(total, now - a.start)
                left = total if by_pace is None else by_pace
            model = request.model
            out.append(Ahead(a.prompt * spt + left * tpot, model if model in adapters else ""))
        return out


def _adapters(endpoints: list[Endpoint]) -> frozenset[str]:
    """The LoRA adapters the pods report running or waiting: the model names that are
    adapters (a base model's requests take no adapter slot)."""
    names: set[str] = set()
    for e in endpoints:
        m = e.metrics
        if m.lora_running or m.lora_waiting:
            names.update(m.lora_running)
            names.update(m.lora_waiting)
    return frozenset(names)
