"""program-aware-fairness: fairness between programs (agentic workflows, tenants: one per
fairness id) by the service each has had, not by turns.

Round robin gives every flow the same number of dispatches, so a program of few large
requests and one of many small ones get very different shares of the pool. This policy counts
what each program consumed, in weighted tokens (an output token costs 2, a prompt token 1,
from the usage of its answers), and sends next from the flow whose program has attained the
least (LAS, least attained service), the age of its head request breaking near-ties:

    score = lasWeightService * (1 - norm(service)) + lasWeightHeadWait * norm(head wait)

with norm() scaling the competing flows' values to [0, 1] (0.5 when they are all equal).
Attained service halves every `lasHalfLifeSeconds` of wall time (0: never), so a program
back from idling competes nearly afresh instead of being punished for old work. Programs
with nothing in flight and no completion for `evictionTtlSeconds` are forgotten (checked
every `evictionSweepSeconds`), with their metric series.

Metrics (llm-d's): `llm_d_epp_program_aware_jains_fairness_index` over the programs' mean
queue waits (1.0: all waited alike), `llm_d_epp_program_aware_avg_wait_time_milliseconds`
and `llm_d_epp_program_aware_attained_service_tokens` per `program_id` (the latter as of the
program's last completion: decay is folded in when the policy reads it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prometheus_client.core import GaugeMetricFamily
from pydantic import Field

from heimdall_proxy.flowcontrol.objectives import DEFAULT_FLOW
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.flowcontrol import FlowHead
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import RequestContext

if TYPE_CHECKING:
    from prometheus_client import Metric

PROGRAM_AWARE_TYPE = "program-aware-fairness"
#: What one token costs a program: output tokens take about twice the compute of prompt ones.
INPUT_TOKEN_COST = 1
OUTPUT_TOKEN_COST = 2
#: Requests picked from the queue whose first attempt has not started yet are remembered at
#: most this long (a client that hung up in between never starts one).
_PICKED_TTL = 600.0


class ProgramAwareParams(PluginParams):
    #: The scoring strategy; llm-d has only "las" ("" means it too).
    strategy: Literal["las", ""] = "las"
    #: A program idle (nothing in flight, no completion) this long is forgotten; 0: never.
    eviction_ttl_seconds: float = Field(default=3600.0, ge=0.0)
    #: How often idle programs are looked for.
    eviction_sweep_seconds: float = Field(default=300.0, gt=0.0)
    #: Weight of the (inverted) attained service: higher favours underserved programs more.
    las_weight_service: float = Field(default=0.8, ge=0.0)
    #: Weight of the head request's wait: the tie-breaker when service is even (cold start).
    las_weight_head_wait: float = Field(default=0.2, ge=0.0)
    #: Half-life of attained service in seconds; 0 keeps it for the program's lifetime.
    las_half_life_seconds: float = Field(default=60.0, ge=0.0)


@dataclass(slots=True)
class Program:
    """What the policy knows of one program. Times are monotonic seconds."""

    #: Attained service (weighted tokens), decayed up to `anchor`.
    service: float = 0.0
    anchor: float | None = None
    #: The service as of its last completion (the gauge's value; None before one).
    reported: float | None = None
    mean_wait_ms: float = 0.0
    waits: int = 0
    dispatched: int = 0
    in_flight: int = 0
    #: Seeded with its creation, so a program that never completes is forgotten too.
    last_completion: float = 0.0


def _spread(value: float, low: float, high: float) -> float:
    return 0.5 if high == low else (value - low) / (high - low)


def jains_index(values: Sequence[float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2): 1.0 when all are equal (and with
    fewer than two values or all zero), down to 1/n when one has everything."""
    squares = sum(x * x for x in values)
    if len(values) <= 1 or squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


@register(PROGRAM_AWARE_TYPE, ProgramAwareParams)
class ProgramAwareFairness(BasePlugin[ProgramAwareParams]):
    """FairnessPolicy, and PreRequest / ResponseComplete to follow each program's requests:
    a request's first attempt records its queue wait (0 when flow control let it through
    without queueing) and the dispatch; every attempt counts in flight until it completes;
    an answer's usage adds to the program's service."""

    type = PROGRAM_AWARE_TYPE

    def __init__(self, name: str, params: ProgramAwareParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.programs: dict[str, Program] = {}
        #: request id -> when the request picked from the queue was queued.
        self._picked: dict[str, float] = {}
        #: Monotonic seconds (tests set their own).
        self.clock: Callable[[], float] = time.monotonic
        self._last_sweep = self.clock()

    # -- state ---------------------------------------------------------------------------

    def program(self, program_id: str) -> Program:
        found = self.programs.get(program_id)
        if found is None:
            found = self.programs[program_id] = Program(last_completion=self.clock())
        return found

    def service(self, program: Program, now: float) -> float:
        """The program's attained service with the decay up to `now` folded in."""
        half_life = self.params.las_half_life_seconds
        if program.anchor is not None and half_life > 0 and now > program.anchor:
            program.service *= 2.0 ** (-(now - program.anchor) / half_life)
        program.anchor = now
        return program.service

    def _sweep(self, now: float) -> None:
        p = self.params
        if now - self._last_sweep < p.eviction_sweep_seconds:
            return
        self._last_sweep = now
        if p.eviction_ttl_seconds > 0:
            for pid in [
                pid
                for pid, prog in self.programs.items()
                if prog.in_flight == 0 and now - prog.last_completion > p.eviction_ttl_seconds
            ]:
                del self.programs[pid]
        for rid in [rid for rid, at in self._picked.items() if now - at > _PICKED_TTL]:
            del self._picked[rid]

    # -- FairnessPolicy -------------------------------------------------------------------

    def pick_flow(self, flows: Sequence[FlowHead], last: str | None) -> int:
        now = self.clock()
        self._sweep(now)
        services = [self.service(self.program(f.fairness_id), now) for f in flows]
        waits = [(now - f.enqueued) * 1000.0 for f in flows]
        lo_s, hi_s = min(services), max(services)
        lo_w, hi_w = min(waits), max(waits)
        p = self.params
        best, best_score = 0, float("-inf")
        for i, (served, waited) in enumerate(zip(services, waits, strict=True)):
            score = p.las_weight_service * (1.0 - _spread(served, lo_s, hi_s))
            score += p.las_weight_head_wait * _spread(waited, lo_w, hi_w)
            if score > best_score:
                best, best_score = i, score
        head = flows[best]
        self._picked[head.request.request_id] = head.enqueued
        return best

    # -- the request's life -------------------------------------------------------------

    async def pre_request(self, ctx: RequestContext) -> None:
        request = ctx.request
        program = self.program(request.fairness_id or DEFAULT_FLOW)
        program.in_flight += 1
        if ctx.attempt:
            return
        now = self.clock()
        queued = self._picked.pop(request.request_id, None)
        wait_ms = (now - queued) * 1000.0 if queued is not None else 0.0
        program.dispatched += 1
        program.waits += 1
        program.mean_wait_ms += (wait_ms - program.mean_wait_ms) / program.waits
        self._sweep(now)

    async def response_complete(self, ctx: RequestContext) -> None:
        program = self.program(ctx.request.fairness_id or DEFAULT_FLOW)
        program.in_flight = max(0, program.in_flight - 1)
        now = self.clock()
        program.last_completion = now
        if ctx.prompt_tokens is None and ctx.output_tokens is None:
            return
        cost = INPUT_TOKEN_COST * (ctx.prompt_tokens or 0)
        cost += OUTPUT_TOKEN_COST * (ctx.output_tokens or 0)
        program.service = self.service(program, now) + cost
        program.reported = program.service

    # -- metrics ------------------------------------------------------------------------

    def fairness_index(self) -> float:
        return jains_index([p.mean_wait_ms for p in self.programs.values() if p.waits])

    def collect_metrics(self) -> Iterable[Metric]:
        index = GaugeMetricFamily(
            "llm_d_epp_program_aware_jains_fairness_index",
            "Jain's fairness index over average wait time across active programs.",
        )
        index.add_metric([], self.fairness_index())
        waits = GaugeMetricFamily(
            "llm_d_epp_program_aware_avg_wait_time_milliseconds",
            "Cumulative mean of flow-control queue wait time per program in milliseconds.",
            labels=["program_id"],
        )
        served = GaugeMetricFamily(
            "llm_d_epp_program_aware_attained_service_tokens",
            "Time-decayed attained service (weighted tokens consumed) per program.",
            labels=["program_id"],
        )
        for pid, prog in self.programs.items():
            if prog.waits:
                waits.add_metric([pid], prog.mean_wait_ms)
            if prog.reported is not None:
                served.add_metric([pid], prog.reported)
        yield index
        yield waits
        yield served
