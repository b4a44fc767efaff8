"""finish-time-scorer (heimdall-proxy's own): prefers the pod where the request would finish
first, in seconds, by stepping a model of each pod's engine forward from what the gateway has
in flight there (framework/engine_model.py).

The load scorers count work (requests, tokens); this one turns the in-flight ledger's view of
each pod into time: the steps the pod will run, each decoding a token of every running request
and prefilling the prompts it admits within its token budget, admitting queued requests as
slots free and as LoRA adapter slots allow, until the request ends. That tells a full pod whose
requests are about to end from one whose requests just began, a pod that runs at half speed
from a fast one with the same work, a pod about to prefill a long prompt that every stream on
it will wait for, and a pod that would have to load this request's adapter from one that holds
it (bench/RESULTS.md, "Finish time: the engine's steps").

It keeps nothing of its own: the attempts in flight, the streams' progress, each pod's pace
(with the batch it was observed at), the models that last ran on each pod and each pod's free
depth (how many requests it runs at once, learned from first tokens by the queue price) are
the ledger's; the adapter slots, and a pod's batch while it queues, are its scraped
metrics."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from pydantic import Field

from heimdall_proxy.datalayer.vllm_metrics import LORA_INFO
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.engine_model import (
    Job,
    StepCosts,
    alone_seconds,
    finish_seconds,
    pod_speeds,
)
from heimdall_proxy.framework.handle import PluginHandle
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
    #: The engine model's step: its fixed part, and the part per sequence decoded, on a pod of
    #: nominal speed (each pod's own speed is learned from its pace and scales both).
    step_time_ms: float = Field(default=8.0, gt=0.0)
    decode_time_per_sequence_ms: float = Field(default=0.15, ge=0.0)
    #: Per token of context a decoding sequence reads in a step (the KV cache's attention).
    kv_read_time_per_token_ns: float = Field(default=60.0, ge=0.0)
    #: vLLM's max_num_batched_tokens: prompt tokens (and one per decoder) a step takes.
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    #: Loading a LoRA adapter the pod does not hold.
    lora_load_time_ms: float = Field(default=200.0, ge=0.0)
    #: A replay starts at the pod's last step seen (a stream's last chunk there) when that is
    #: this recent; an older one says the streams stalled, and the replay starts now.
    max_step_age_ms: float = Field(default=5000.0, gt=0.0)


@register(FINISH_TIME_SCORER_TYPE, FinishTimeParams)
class FinishTimeScorer(BasePlugin[FinishTimeParams]):
    """Per candidate, the seconds until the request would finish there
    (framework/engine_model.py), from the ledger (handle.load):

    - the requests this gateway has in flight on the pod, oldest first: a stream that has
      begun decodes (its output limit, max_tokens, ..., else `defaultOutputTokens`, less the
      events streamed); a request not streamed, by its age at the pod's pace; the others wait
      with the prompt the pod does not hold (as counted when they were sent);
    - the replay starts at the pod's last step seen, the newest chunk of its streams, so a
      long prefill under way there counts with the time it has left;
    - how many the pod runs at once, once it was seen to queue: what its engine ran while
      others waited (two scrapes in a row), else one more than its learned free depth, never
      fewer than this gateway's requests seen streaming there at once (the queue price's
      `slots`, framework/queue_price.py); before that, all of them;
    - the pod's speed: its pace (time per output token) over the engine model's step for the
      batch the pace was observed at (streams decoding there, the context they read, and the
      prompt tokens prefilled between their tokens), the fleet's mean for a pod with no pace
      yet, 1.0 before any;
    - LoRA: the adapters of the models that last ran on the pod (their first chunk came) and
      those its metrics show running are taken as resident, and a request for another one
      loads it (`loraLoadTimeMs`) or waits for an adapter slot
      (`max_lora` of the pod's `vllm:lora_requests_info`; unknown: the rule is not applied).

    Score: the earliest finish over this pod's, so the pod that finishes first scores 1.0 and
    one that takes twice as long 0.5.

    Only this replica's requests are seen when the ledger is shared between replicas (their
    attempts are not published); the others' still count through the load scorers."""

    type = FINISH_TIME_SCORER_TYPE
    metric_families = frozenset({LORA_INFO})

    def __init__(self, name: str, params: FinishTimeParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.load = handle.load
        seconds_per_token = 1.0 / params.peak_prefill_throughput
        self.costs = StepCosts(
            step=params.step_time_ms / 1e3,
            per_seq=params.decode_time_per_sequence_ms / 1e3,
            per_prefill_token=seconds_per_token,
            per_context_token=params.kv_read_time_per_token_ns / 1e9,
            budget=params.max_num_batched_tokens,
            lora_load=params.lora_load_time_ms / 1e3,
        )
        #: The ledger's queue price at this rate: each pod's learned free depth (reading it
        #: makes the relay count each attempt's uncached prompt, which the replay needs).
        self.queue = self.load.queue_price(seconds_per_token)
        self._match = params.match_reader()
        self._max_age = params.max_step_age_ms / 1e3
        #: The clock chunk times and ages are read with (a test sets its own).
        self.clock = time.monotonic

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        load = self.load
        info = self._match(state)
        prompt = info.prompt_tokens if info is not None else request.estimated_tokens()
        cap = request.output_cap()
        output = self.params.default_output_tokens if cap is None else cap
        names = CandidateNames.of(endpoints)
        candidates = names.name_set()
        speeds = pod_speeds(load.paces(), candidates, self.costs)
        fleet = sum(speeds.values()) / len(speeds) if speeds else 1.0
        adapters = _adapters(endpoints)
        adapter = request.model if request.model in adapters else ""
        # On an idle pod the request's time is its time at nominal speed times the pod's
        # speed, plus its adapter's load where that is not resident. Most pods of a large
        # pool are idle, hold none of the prompt and have no pace: they share one estimate.
        costs = self.costs
        lora_load = costs.lora_load if adapter else 0.0
        usual_job = Job(max(1, prompt), 0, output, adapter)
        nominal = alone_seconds(costs, usual_job)
        usual = fleet * nominal + lora_load
        finish = {pod: v * nominal + lora_load for pod, v in speeds.items()}
        own: dict[str, Job] = {}
        if info is not None:
            for pod in info.matched_blocks.keys() & candidates:
                cached = min(prompt - 1, info.cached_tokens(pod))
                job = own[pod] = Job(max(1, prompt - cached), max(0, cached), output, adapter)
                finish[pod] = speeds.get(pod, fleet) * alone_seconds(costs, job) + lora_load
        if adapter:  # idle pods that hold it, or whose adapter slots are unknown, load nothing
            for e in endpoints:
                cap = e.metrics.max_lora
                if cap <= 0 or adapter in _resident(load.recent_models(e.name), e, adapters)[-cap:]:
                    finish[e.name] = finish.get(e.name, usual) - lora_load
        busy = load.busy_own_pods() & candidates
        if busy:
            now = self.clock()
            index = names.index()
            by_name = index if index is not None else {e.name: i for i, e in enumerate(endpoints)}
            for pod in busy:
                e = endpoints[by_name[pod]]
                finish[pod] = self._replay(
                    pod,
                    own.get(pod, usual_job),
                    costs.scaled(speeds.get(pod, fleet)),
                    e.metrics.max_lora if adapter else 0,
                    _resident(load.recent_models(pod), e, adapters),
                    adapters,
                    now,
                )
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
        pod: str,
        own: Job,
        costs: StepCosts,
        max_lora: int,
        resident: list[str],
        adapters: frozenset[str],
        now: float,
    ) -> float:
        """Seconds until `own` would finish on busy `pod`: its attempts in flight replayed
        from the pod's last step seen (the newest chunk of its streams; with none running,
        the oldest attempt's send), `own` sent now."""
        load = self.load
        pace = load.pace(pod)
        default = self.params.default_output_tokens
        running: list[Job] = []
        waiting: list[Job] = []
        last = 0.0
        first_sent = 0.0  # the oldest attempt's send: where a pod with no stream began
        for a in load.attempts_on(pod):
            if not first_sent:
                first_sent = a.start
            cached = max(0, a.whole - a.prompt)  # queued: what the pod held of it when sent
            ctx = a.ctx
            if ctx is None:  # a disaggregated hop: its prefill alone
                waiting.append(Job(a.prompt, cached, 1))
                continue
            request = ctx.request
            cap = request.output_cap()
            total = default if cap is None else cap
            model = request.model if request.model in adapters else ""
            if request.stream:
                if ctx.events_seen:
                    last = max(last, ctx.last_chunk_at)
                    left = max(1, total - ctx.events_seen)
                    running.append(Job(0, a.whole + ctx.events_seen, left, model))
                else:
                    waiting.append(Job(a.prompt, cached, total, model))
                continue
            by_pace = None if pace is None else pace.tokens_left(total, now - a.start)
            if by_pace is not None:
                done = int(total - by_pace)
                running.append(Job(0, a.whole + done, max(1, int(by_pace)), model))
            else:
                waiting.append(Job(a.prompt, cached, total, model))
        if not running:  # nothing streams yet: it has worked on the oldest since it was sent
            last = first_sent
        since = now - last if last and now - last <= self._max_age else 0.0
        return finish_seconds(
            running,
            waiting,
            own,
            costs,
            self.queue.slots(pod),
            max_lora,
            resident,
            own_at=max(0.0, since),
        )


def _resident(recent: Iterable[str], pod: Endpoint, adapters: frozenset[str]) -> list[str]:
    """The adapters `pod` most likely holds, least recently used first: those of the models
    that last ran there, then those its metrics show running."""
    out = [m for m in recent if m in adapters]
    for m in pod.metrics.lora_running:
        if m in out:
            out.remove(m)
        out.append(m)
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
