"""The oracle: the best a greedy dispatcher with full knowledge does on the matrix's pods.

A discrete-event simulation of the simulated pods (heimdall_proxy/sim/engine.py's step
model, reduced to what decides latency): each pod runs `slots` requests at a time, FIFO
behind them; every step gives each running request its next tokens (its prompt in chunks
of at most `max_num_batched_tokens`, then one token per step) and lasts

    step_base + prefill_cost_per_token * prefill tokens + decode_cost_per_seq * decoders
              + kv_read_cost_per_token * their context

as SimOptions defines it. A request admitted to a pod takes the longest prefix of its
16-token prompt blocks that pod's cache holds (at least one token is always computed, as in
vLLM); the cache is an LRU of `num_gpu_blocks` prompt blocks, filled as steps compute them.
LoRA adapters as the engine has them (its LoraSlots): `max_loras` resident, least recently
used evicted; a request whose adapter is not resident while every slot's adapter is in use by
a running request is passed over, the requests behind it going first, and the step that
admits one whose adapter is not resident lasts `lora_load_time` longer. (The mixed and
unequal shapes serve two adapters with one resident: without this the oracle could swap
adapters for free and was no floor there.)
Left out: preemption and the KV blocks generated tokens hold, the network.

The dispatcher sends each request on arrival to the pod on which, given every pod's running
requests, queue and cache at that moment, it would finish first (a copy of each pod is run
forward with no further arrivals); ties go to the lower pod. `round_robin` is the same
simulation dealing requests in turn, the yardstick the unit tests hold the oracle to.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.harness.costs import SLOTS
from bench.harness.stats import percentile
from bench.harness.workloads import Workload
from heimdall_proxy.sim.engine import LoraSlots
from heimdall_proxy.sim.options import SimOptions
from heimdall_proxy.sim.tokens import Tokenizer

Policy = Literal["greedy", "round_robin"]


@dataclass(frozen=True, slots=True)
class OracleRequest:
    arrival: float
    prompt: int
    output: int
    #: chained keys of the prompt's full blocks (the model folded into the first)
    blocks: tuple[int, ...]
    #: the LoRA adapter it names (None: the base model)
    lora: str | None = None


def block_keys(ids: Sequence[int], model: str, block_size: int) -> tuple[int, ...]:
    out = []
    h = hash(model)
    for b in range(len(ids) // block_size):
        h = hash((h, tuple(ids[b * block_size : (b + 1) * block_size])))
        out.append(h)
    return tuple(out)


def requests_of(workload: Workload, block_size: int | None = None) -> list[OracleRequest]:
    """A workload's requests as the pods see them: prompt ids by the simulator's tokenizer,
    any model but the pods' base model an adapter (as sim/pod.py reads it)."""
    bs = block_size or SimOptions().block_size
    base = SimOptions().model
    tok = Tokenizer()
    out = []
    for r in workload.requests:
        api = "chat" if "messages" in r.body else "completions"
        ids = tok.prompt(api, r.body).ids
        output = max(1, int(r.body.get("max_tokens") or 16))
        model = str(r.body.get("model", ""))
        lora = model if model != base else None
        out.append(OracleRequest(r.offset, len(ids), output, block_keys(ids, model, bs), lora))
    return out


class _Seq:
    __slots__ = ("computed", "finish", "first_token", "hits", "produced", "req", "rid")

    def __init__(self, rid: int, req: OracleRequest) -> None:
        self.rid = rid
        self.req = req
        self.computed = 0  # prompt and generated tokens in the KV (the decode context)
        self.produced = 0
        self.hits = -1  # cached prompt tokens at admission (-1: not admitted yet)
        self.first_token = math.nan
        self.finish = math.nan

    def copy(self) -> _Seq:
        s = _Seq(self.rid, self.req)
        s.computed, s.produced, s.hits = self.computed, self.produced, self.hits
        s.first_token, s.finish = self.first_token, self.finish
        return s

    @property
    def prefilling(self) -> bool:
        return self.computed < self.req.prompt


class Pod:
    """One simulated pod: slots, a FIFO queue, an LRU of prompt blocks and adapter slots."""

    def __init__(self, options: SimOptions, slots: int = SLOTS) -> None:
        self.o = options
        self.slots = slots
        self.clock = 0.0
        self.running: list[_Seq] = []
        self.waiting: deque[_Seq] = deque()
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.loras = LoraSlots(options.max_loras)
        self.done: list[_Seq] = []

    def copy(self) -> Pod:
        p = Pod(self.o, self.slots)
        p.clock = self.clock
        p.running = [s.copy() for s in self.running]
        p.waiting = deque(s.copy() for s in self.waiting)
        p.lru = self.lru.copy()
        p.loras.resident = self.loras.resident.copy()
        return p

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def submit(self, seq: _Seq, at: float) -> None:
        if not self.busy:
            self.clock = max(self.clock, at)
        self.waiting.append(seq)

    # ---- the cache ------------------------------------------------------------------
    def _lookup(self, req: OracleRequest) -> int:
        max_hit = (req.prompt - 1) // self.o.block_size
        n = 0
        for key in req.blocks[:max_hit]:
            if key not in self.lru:
                break
            self.lru.move_to_end(key)
            n += 1
        return n * self.o.block_size

    def _store(self, seq: _Seq) -> None:
        full = min(seq.computed, seq.req.prompt) // self.o.block_size
        for key in seq.req.blocks[:full]:
            self.lru[key] = None
            self.lru.move_to_end(key)
        while len(self.lru) > self.o.num_gpu_blocks:
            self.lru.popitem(last=False)

    # ---- steps ----------------------------------------------------------------------
    def _step(self) -> None:
        o = self.o
        budget = o.max_num_batched_tokens
        plan: list[tuple[_Seq, int]] = []
        prefill = decoders = context = 0
        for seq in self.running:
            if budget <= 0:
                break
            n = min(seq.req.prompt - seq.computed, budget) if seq.prefilling else 1
            if seq.prefilling:
                prefill += n
            else:
                decoders += 1
                context += seq.computed
            plan.append((seq, n))
            budget -= n
        in_use = self._loras_in_use()
        passed: list[_Seq] = []
        load = 0.0
        while self.waiting and budget > 0 and len(self.running) < self.slots:
            seq = self.waiting.popleft()
            lora = seq.req.lora
            if lora:
                if not self.loras.can_use(lora, in_use):
                    passed.append(seq)
                    continue
                if self.loras.use(lora, in_use):
                    load += o.lora_load_time
                in_use.add(lora)
            seq.hits = self._lookup(seq.req)
            seq.computed = seq.hits
            n = min(seq.req.prompt - seq.computed, budget)
            prefill += n
            budget -= n
            self.running.append(seq)
            plan.append((seq, n))
        self.waiting.extendleft(reversed(passed))
        self.clock += (
            o.step_base
            + o.prefill_cost_per_token * prefill
            + o.decode_cost_per_seq * decoders
            + o.kv_read_cost_per_token * context
            + load
        )
        for seq, n in plan:
            seq.computed += n
            if seq.computed >= seq.req.prompt:
                seq.produced += 1
                if seq.produced == 1:
                    seq.first_token = self.clock
                self._store(seq)
            elif n:
                self._store(seq)  # a chunk: its full blocks are cached as they are computed
        self._retire()

    def _loras_in_use(self) -> set[str]:
        return {s.req.lora for s in self.running if s.req.lora}

    def _admissible(self) -> bool:
        """Whether a waiting request may be admitted now, slots and budget aside."""
        in_use = self._loras_in_use()
        return any(not s.req.lora or self.loras.can_use(s.req.lora, in_use) for s in self.waiting)

    def _retire(self) -> None:
        still = []
        for seq in self.running:
            if seq.produced >= seq.req.output:
                seq.finish = self.clock
                self.done.append(seq)
            else:
                still.append(seq)
        self.running = still

    def _decode_span(self, limit: float) -> bool:
        """Jump over steps in which nothing but decoding can happen (every running request
        decodes, none can be admitted: every slot is taken or every waiting request's adapter
        waits for one of the running requests to end): the same durations, summed in closed
        form. Stops at the first step ending at or after `limit` (an arrival may join then)
        unless every slot is taken. False when the next step is not such a step."""
        if not self.running or any(s.prefilling for s in self.running):
            return False
        if len(self.running) < self.slots and self._admissible():
            return False
        o = self.o
        n = len(self.running)
        a = o.step_base + n * o.decode_cost_per_seq
        c = sum(s.computed for s in self.running)
        kmax = min(s.req.output - s.produced for s in self.running)

        def elapsed(k: int) -> float:
            return k * a + o.kv_read_cost_per_token * (k * c + n * k * (k - 1) / 2)

        k = kmax
        if len(self.running) < self.slots and limit - self.clock < elapsed(kmax):
            k = bisect.bisect_left(range(1, kmax + 1), limit - self.clock, key=elapsed) + 1
        if k <= 1:
            return False
        self.clock += elapsed(k)
        for s in self.running:
            s.produced += k
            s.computed += k
        self._retire()
        return True

    def advance(self, until: float) -> None:
        """Run every step that starts before `until` (the one running then completes)."""
        while self.busy and self.clock < until:
            if not self._decode_span(until):
                self._step()
        if not self.busy:
            self.clock = max(self.clock, until)

    def finish_of(self, seq: _Seq) -> float:
        """When `seq` (queued here) finishes if nothing else arrives."""
        while math.isnan(seq.finish):
            if not self._decode_span(math.inf):
                self._step()
        return seq.finish


@dataclass
class OracleResult:
    policy: str
    e2e: list[float]
    ttft: list[float]
    total: float
    hit_tokens: int
    prompt_tokens: int
    per_pod: list[int] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def mean(self) -> float:
        return sum(self.e2e) / len(self.e2e) if self.e2e else 0.0

    def p95(self) -> float:
        """The 95th percentile, as bench/harness/stats.py computes the runs'."""
        return percentile(self.e2e, 95) or 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "total": self.total,
            "e2e_mean": self.mean(),
            "e2e_p95": self.p95(),
            "ttft_mean": sum(self.ttft) / len(self.ttft) if self.ttft else 0.0,
            "prefix_hit_rate": self.hit_rate,
            "requests_per_pod": self.per_pod,
        }


def simulate(
    requests: Sequence[OracleRequest],
    pods: Sequence[SimOptions],
    policy: Policy = "greedy",
    slots: int = SLOTS,
) -> OracleResult:
    """Dispatch `requests` (in arrival order) over pods with these options."""
    fleet = [Pod(o, slots) for o in pods]
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    seqs: list[_Seq | None] = [None] * len(requests)
    per_pod = [0] * len(fleet)
    for n, i in enumerate(order):
        req = requests[i]
        for pod in fleet:
            pod.advance(req.arrival)
        seq = _Seq(i, req)
        if policy == "round_robin":
            best = n % len(fleet)
        else:
            finishes = []
            for pod in fleet:
                trial = pod.copy()
                probe = seq.copy()
                trial.submit(probe, req.arrival)
                finishes.append(trial.finish_of(probe))
            best = min(range(len(fleet)), key=lambda p: (finishes[p], p))
        fleet[best].submit(seq, req.arrival)
        per_pod[best] += 1
        seqs[i] = seq
    for pod in fleet:
        pod.advance(math.inf)
    done = [s for s in seqs if s is not None]
    return OracleResult(
        policy,
        [s.finish - s.req.arrival for s in done],
        [s.first_token - s.req.arrival for s in done],
        max((s.finish for s in done), default=0.0),
        sum(max(0, s.hits) for s in done),
        sum(s.req.prompt for s in done),
        per_pod,
    )
