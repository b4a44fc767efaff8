"""When a request sent to a pod now would finish, by stepping a model of the pod's engine
forward from what the gateway has in flight there: finish-time-scorer's estimate.

A vLLM engine runs in steps. Each step decodes one token of every running sequence and
prefills a chunk of the prompts it admitted, within a token budget (`max_num_batched_tokens`),
and admits waiting requests first come, first served while it has a free slot
(`max_num_seqs`); a LoRA request whose adapter is not resident waits, when every adapter slot
holds another adapter in use, and the requests behind it go first. A step costs a fixed part,
a part per sequence decoded, one per prompt token prefilled and one per token of context the
decoders read, so a pod is slower per token with more running, and a long prompt admitted
beside them slows every stream on the pod for a step. Counting each request's work left as
seconds at one pace (what finish-time-scorer did first: a replay of slots freeing) misses
both, and on mixed short and long traffic that was most of the gap to a router that knows
each pod's timeline (bench/RESULTS.md, "Finish time: the engine's steps").

`finish_seconds` replays the steps of one pod until a new request appended to its queue ends.
Steps in which nothing but decoding can happen (every running request past its prompt and no
request admissible) are jumped over in closed form, so a replay costs a few iterations per
request in flight, not one per token."""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from heimdall_proxy.framework.pace import Pace

__all__ = ["Job", "StepCosts", "alone_seconds", "finish_seconds", "pod_speeds"]

#: Replay iterations after which a replay stops and answers with the time reached (a bound
#: that traffic does not reach: each iteration admits, finishes or prefills a chunk).
MAX_ITERATIONS = 20_000


@dataclass(frozen=True, slots=True)
class StepCosts:
    """What one engine step costs, in seconds, and the engine's per-step limits."""

    #: every step
    step: float = 0.008
    #: per sequence decoded in the step
    per_seq: float = 0.00015
    #: per prompt token prefilled in the step
    per_prefill_token: float = 1.0 / 16000.0
    #: per token of context the step's decoders read
    per_context_token: float = 6e-8
    #: prompt tokens one step prefills at most, with one per decoder (vLLM's
    #: max_num_batched_tokens)
    budget: int = 2048
    #: loading an adapter that is not resident (not scaled with a pod's speed: a copy of
    #: weights, not a step)
    lora_load: float = 0.2

    def scaled(self, speed: float) -> StepCosts:
        """These costs on a pod `speed` times as slow (2.0: every step takes twice as long)."""
        if speed == 1.0:
            return self
        return StepCosts(
            self.step * speed,
            self.per_seq * speed,
            self.per_prefill_token * speed,
            self.per_context_token * speed,
            self.budget,
            self.lora_load,
        )

    def decode_step(self, running: float) -> float:
        """A step with `running` sequences decoding and nothing prefilling, context aside."""
        return self.step + self.per_seq * running


class Job(NamedTuple):
    """A request as the replay sees it: prompt tokens still to prefill (at least one for a
    request not yet admitted: vLLM recomputes the last prompt token), tokens already in its
    context (cached prompt, prefilled prompt and output so far), output tokens still to come,
    and the LoRA adapter it names ("" for the base model)."""

    prefill: int
    context: int
    output: int
    adapter: str = ""


class _Live:
    """A job as the replay advances it."""

    __slots__ = ("adapter", "context", "output", "prefill")

    def __init__(self, prefill: int, context: int, output: int, adapter: str) -> None:
        self.prefill = prefill
        self.context = context
        self.output = output
        self.adapter = adapter


def alone_seconds(costs: StepCosts, job: Job, load: bool = False) -> float:
    """Seconds `job` takes on an idle pod (closed form of the replay with nothing else in
    flight), plus the adapter's load when `load`."""
    budget = max(1, costs.budget)
    chunks = max(1, -(-job.prefill // budget))
    prefill = chunks * costs.step + costs.per_prefill_token * job.prefill
    # the last chunk's step yields the first token; the rest decode one per step
    k = max(0, job.output - 1)
    ctx = job.context + job.prefill
    decode = k * costs.decode_step(1) + costs.per_context_token * (k * ctx + k * (k - 1) / 2)
    return prefill + decode + (costs.lora_load if load else 0.0)


def finish_seconds(
    running: Iterable[Job],
    waiting: Iterable[Job],
    own: Job,
    costs: StepCosts,
    slots: int | None,
    max_adapters: int = 0,
    resident: Sequence[str] = (),
    own_at: float = 0.0,
) -> float:
    """Seconds until `own`, sent `own_at` seconds after the pod's last step ended (when it
    ran `running` and had `waiting` queued, oldest first), finishes, counted from when it is
    sent. It joins the queue at the first step that starts once it is there.

    A queued job (and `own`) prefills at least one token, whatever its `prefill` says.
    `slots`: how many requests the pod runs at once (None: every one sent). `max_adapters`:
    its adapter slots (0: unknown, the LoRA rule is not applied); `resident`: the adapters it
    holds, least recently used first."""
    run = [_Live(*j) for j in running]
    wait = deque(_Live(max(1, p), c, o, a) for p, c, o, a in waiting)
    mine = _Live(max(1, own.prefill), own.context, max(1, own.output), own.adapter)
    loras: OrderedDict[str, None] = OrderedDict()
    if max_adapters > 0:
        loras.update((a, None) for a in resident)
        while len(loras) > max_adapters:
            loras.popitem(last=False)
    joined = False
    t = 0.0
    for _ in range(MAX_ITERATIONS):
        if not joined and t >= own_at:
            wait.append(mine)
            joined = True
        if not run and not wait:  # idle until it is sent
            t = own_at
            continue
        if _decode_only(run, wait, slots, loras, max_adapters):
            t += _decode_span(run, costs, None if joined else own_at - t)
        else:
            t += _step(run, wait, costs, slots, loras, max_adapters)
        if mine.output <= 0:
            break
        run = [j for j in run if j.output > 0]
    return max(0.0, t - own_at)


def _decode_span(run: list[_Live], costs: StepCosts, limit: float | None) -> float:
    """Steps in which every running job decodes a token, until the first one ends (or, with
    a `limit`, the first step ending at or after it: a request sent then may join). Their
    seconds, in closed form."""
    n = len(run)
    a = costs.decode_step(n)
    c = sum(j.context for j in run)
    kv = costs.per_context_token

    def elapsed(k: int) -> float:
        return k * a + kv * (k * c + n * k * (k - 1) / 2)

    k = min(j.output for j in run)
    if limit is not None and elapsed(k) > limit:
        k = max(1, bisect.bisect_left(range(1, k + 1), limit, key=elapsed) + 1)
    for j in run:
        j.context += k
        j.output -= k
    return elapsed(k)


def _usable(adapter: str, in_use: set[str], loras: OrderedDict[str, None], cap: int) -> bool:
    if not adapter or cap <= 0 or adapter in loras or len(loras) < cap:
        return True
    return any(a not in in_use for a in loras)


def _decode_only(
    run: list[_Live],
    wait: deque[_Live],
    slots: int | None,
    loras: OrderedDict[str, None],
    cap: int,
) -> bool:
    """Whether the next steps can only decode: every running job is past its prompt and no
    waiting one may start (slots full, or each one's adapter waits for a slot)."""
    if not run or any(j.prefill > 0 for j in run):
        return False
    if not wait or (slots is not None and len(run) >= slots):
        return True
    in_use = {j.adapter for j in run if j.adapter}
    return not any(_usable(j.adapter, in_use, loras, cap) for j in wait)


def _step(
    run: list[_Live],
    wait: deque[_Live],
    costs: StepCosts,
    slots: int | None,
    loras: OrderedDict[str, None],
    cap: int,
) -> float:
    """One step: the running jobs first (a chunk of each prompt, a token of each decoder),
    then waiting ones admitted in order while the budget and a slot allow. Its seconds."""
    budget = costs.budget
    plan: list[tuple[_Live, int]] = []
    prefill = decoders = context = 0
    for j in run:
        if budget <= 0:
            break
        if j.prefill > 0:
            n = min(j.prefill, budget)
            prefill += n
        else:
            n = 1
            decoders += 1
            context += j.context
        plan.append((j, n))
        budget -= n
    in_use = {j.adapter for j in run if j.adapter}
    passed: list[_Live] = []
    load = 0.0
    while wait and budget > 0 and (slots is None or len(run) < slots):
        j = wait.popleft()
        adapter = j.adapter
        if adapter and cap > 0:
            if not _usable(adapter, in_use, loras, cap):
                passed.append(j)
                continue
            if adapter in loras:
                loras.move_to_end(adapter)
            else:
                if len(loras) >= cap:
                    victim = next(a for a in loras if a not in in_use)
                    del loras[victim]
                loras[adapter] = None
                load += costs.lora_load
            in_use.add(adapter)
        n = min(j.prefill, budget)
        prefill += n
        budget -= n
        run.append(j)
        plan.append((j, n))
    wait.extendleft(reversed(passed))
    for j, n in plan:
        if j.prefill > 0:
            j.prefill -= n
            j.context += n
            if j.prefill == 0:  # the prompt's last chunk yields the first token
                j.output -= 1
        else:
            j.context += 1
            j.output -= 1
    return (
        costs.step
        + costs.per_prefill_token * prefill
        + costs.per_seq * decoders
        + costs.per_context_token * context
        + load
    )


def pod_speeds(
    paces: Mapping[str, Pace], candidates: Container[str], costs: StepCosts
) -> dict[str, float]:
    """Each candidate's speed, for those with a pace: its time per output token over the
    engine model's step for the batch that pace was seen at (its decoders, each reading a
    context of the sampled streams' size, and the prompt tokens prefilled beside them), in
    one pass over the pool, inline: it runs for every pod on every request."""
    step, per_seq, per_prefill = costs.step, costs.per_seq, costs.per_prefill_token
    per_context = costs.per_context_token
    speeds: dict[str, float] = {}
    for pod, pace in paces.items():
        tpot, running = pace.tpot, pace.running
        if tpot is None or running is None or pod not in candidates:
            continue
        batch = (per_seq + per_context * (pace.context or 0.0)) * running
        v = tpot / (step + batch + per_prefill * (pace.prefill_per_token or 0.0))
        speeds[pod] = MIN_SPEED if v < MIN_SPEED else MAX_SPEED if v > MAX_SPEED else v
    return speeds


#: Bounds of a pod's learned speed against the engine model's nominal steps: a pace read from
#: a stream that waited on something else (the client, a stalled pod) stays within them.
MIN_SPEED = 0.1
MAX_SPEED = 50.0
