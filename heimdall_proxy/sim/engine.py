"""The continuous-batching engine of one simulated pod: vLLM V1's scheduler, simplified.

One asyncio task drives "steps". Each step:

1. Running requests first, in admission order: each gets the tokens it still needs
   (1 for a decoding request, the rest of its prompt - chunked - for one in prefill) out of
   the step's token budget (`max_num_batched_tokens`). A request that needs a new block when
   none is free preempts the most recently admitted running request (recompute: its blocks
   are freed and it goes back to the front of the waiting queue), possibly itself.
2. If nothing was preempted, waiting requests in FIFO order while there is budget and fewer
   than `max_num_seqs` run: a fresh request first takes the longest cached prefix of its
   full blocks (prefix caching; at least one token is always computed), then blocks for the
   tokens it computes now; it is admitted only if they fit, else the queue waits. A request
   for a LoRA adapter that is not resident waits while every adapter slot is used by running
   requests. KV loaded from elsewhere (a prefill pod's blocks, the CPU tier) is pulled
   asynchronously, as vLLM's connectors do: the request holds its blocks and waits until the
   transfer time has passed, while other requests keep stepping.
3. The step lasts `step_base + prefill_cost_per_token * prefill tokens +
   decode_cost_per_seq * decoding requests + kv_read_cost_per_token * their context` plus
   any adapter load and multimodal encoder time, times `time_scale`.
4. Afterwards every request that caught up with its tokens samples one: its newly full
   blocks are hashed into the cache (BlockStored), and it finishes at max_tokens, a stop
   word or max_model_len, freeing its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from heimdall_proxy.sim.kvcache import Block, BlockPool, block_hash, extra_keys
from heimdall_proxy.sim.kvevents import KVEvent
from heimdall_proxy.sim.options import SimOptions
from heimdall_proxy.sim.tokens import MMItem, OutputWords, word_id

log = logging.getLogger(__name__)

#: Seconds of lost step time a busy pod may make up (see Engine._step).
CATCH_UP = 0.1


class Status(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"  # holding blocks while KV arrives from elsewhere
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class Seq:
    """One request inside the engine."""

    __slots__ = (
        "all_ids",
        "arrival",
        "blocks",
        "cache_salt",
        "cached_tokens",
        "changed",
        "encode_only",
        "encoded",
        "ext_tokens",
        "finish_reason",
        "finished_at",
        "first_scheduled",
        "first_token_at",
        "hashes",
        "id",
        "kv_transfer_out",
        "last_token_at",
        "lora",
        "lora_id",
        "max_tokens",
        "mm",
        "num_cached_blocks",
        "num_computed",
        "output_words",
        "prefill_only",
        "prompt_len",
        "ready_at",
        "remote_encoded",
        "remote_prefill",
        "status",
        "stop",
        "words",
    )

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        max_tokens: int,
        words: OutputWords,
        *,
        lora: str | None = None,
        lora_id: int | None = None,
        mm: list[MMItem] | None = None,
        remote_encoded: frozenset[str] = frozenset(),
        remote_prefill: bool = False,
        prefill_only: bool = False,
        encode_only: bool = False,
        stop: tuple[str, ...] = (),
        cache_salt: str | None = None,
    ) -> None:
        self.id = request_id
        self.cache_salt = cache_salt
        self.all_ids = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.max_tokens = max_tokens
        self.words = words
        self.lora = lora
        self.lora_id = lora_id
        self.mm = mm or []
        self.remote_encoded = remote_encoded
        self.remote_prefill = remote_prefill
        self.prefill_only = prefill_only
        self.encode_only = encode_only
        self.stop = stop
        self.output_words: list[str] = []
        self.num_computed = 0
        self.blocks: list[Block] = []
        self.hashes: list[int] = []
        self.num_cached_blocks = 0
        self.cached_tokens = 0
        self.ext_tokens = 0
        self.ready_at = 0.0
        self.encoded = not self.mm
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.kv_transfer_out: list[int] | None = None
        self.arrival = 0.0
        self.first_scheduled: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        #: Set whenever the request produced a token or ended.
        self.changed = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED)

    @property
    def num_output(self) -> int:
        return len(self.output_words)

    @property
    def text(self) -> str:
        return " ".join(self.output_words)

    async def wait_done(self) -> None:
        while not self.done:
            self.changed.clear()
            await self.changed.wait()


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.count += 1
        self.total += value


TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass(slots=True)
class Stats:
    """Counters and histograms behind /metrics (vLLM V1's names)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    success: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))


class LoraSlots:
    """Adapters resident on the GPU (at most max_loras, least recently used evicted)."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max(1, max_loras)
        self.resident: OrderedDict[str, None] = OrderedDict()
        self.loads = 0

    def can_use(self, name: str, in_use: set[str]) -> bool:
        if name in self.resident or len(self.resident) < self.max_loras:
            return True
        return any(r not in in_use for r in self.resident)

    def use(self, name: str, in_use: set[str]) -> bool:
        """Make `name` resident; True when that needed a load."""
        if name in self.resident:
            self.resident.move_to_end(name)
            return False
        if len(self.resident) >= self.max_loras:
            victim = next(r for r in self.resident if r not in in_use)
            del self.resident[victim]
        self.resident[name] = None
        self.loads += 1
        return True


@dataclass(slots=True)
class Plan:
    items: list[tuple[Seq, int]] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_seqs: int = 0
    context_tokens: int = 0
    extra: float = 0.0


class Engine:
    def __init__(
        self,
        options: SimOptions,
        on_events: Callable[[list[KVEvent]], None] | None = None,
    ) -> None:
        self.options = options
        self.pool = BlockPool(
            options.num_gpu_blocks,
            options.block_size,
            enable_caching=options.enable_prefix_caching,
            cpu_blocks=options.cpu_offload_blocks,
            record_events=on_events is not None,
        )
        self.on_events = on_events
        self.loras = LoraSlots(options.max_loras)
        self.stats = Stats()
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        #: Hashes of multimodal items whose encoder output this pod holds.
        self.encoder_cache: OrderedDict[str, None] = OrderedDict()
        self.encoder_cache_size = 128
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._deadline = 0.0

    # ---- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"sim-engine-{self.options.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [*self.waiting, *self.running]:
            self.abort(seq)

    # ---- requests ---------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def capacity_tokens(self) -> int:
        return self.options.num_gpu_blocks * self.options.block_size

    def submit(self, seq: Seq) -> None:
        seq.arrival = time.monotonic()
        self.waiting.append(seq)
        self._wake.set()
        self.start()

    def abort(self, seq: Seq) -> None:
        if seq.done:
            return
        if seq.status in (Status.WAITING, Status.LOADING):
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
        elif seq.status is Status.RUNNING:
            with contextlib.suppress(ValueError):
                self.running.remove(seq)
        self._release(seq)
        seq.status = Status.ABORTED
        seq.finish_reason = "abort"
        seq.finished_at = time.monotonic()
        self.stats.success["abort"] = self.stats.success.get("abort", 0) + 1
        seq.changed.set()
        self._wake.set()

    def reset_prefix_cache(self) -> bool:
        ok = self.pool.reset()
        if ok:
            self.encoder_cache.clear()
        self._flush_events()
        return ok

    def lora_adapters(self) -> tuple[list[str], list[str]]:
        """Adapters of running and of waiting requests, in first-seen order."""
        running = list(dict.fromkeys(s.lora for s in self.running if s.lora))
        waiting = list(dict.fromkeys(s.lora for s in self.waiting if s.lora))
        return running, waiting

    # ---- the step loop ----------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug must not leave clients waiting forever: fail what is in flight.
                log.exception("sim engine %s: step failed", self.options.name)
                for seq in [*self.waiting, *self.running]:
                    self.abort(seq)

    async def _step(self) -> None:
        """Schedule one step, let its time pass, then apply its results."""
        self._wake.clear()
        plan = self._schedule(time.monotonic())
        self._flush_events()
        if not plan.items:
            timeout = self._next_ready(time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            # An idle pod owes no time: the next step starts its own clock.
            self._deadline = time.monotonic()
            return
        o = self.options
        duration = (
            o.step_base
            + o.prefill_cost_per_token * plan.prefill_tokens
            + o.decode_cost_per_seq * plan.decode_seqs
            + o.kv_read_cost_per_token * plan.context_tokens
            + plan.extra
        )
        # Sleep to a running deadline so the loop's own overhead does not add up, and let a
        # busy pod that the host kept from running (a shared CPU) catch up on up to
        # CATCH_UP seconds, as a GPU's step time does not depend on the host's load: the
        # pod's throughput then follows the cost model that bench/matrix.py's bound uses.
        now = time.monotonic()
        self._deadline = max(self._deadline, now - CATCH_UP) + duration * o.time_scale
        await asyncio.sleep(max(0.0, self._deadline - now))
        self.stats.steps += 1
        self._complete(plan, time.monotonic())
        self._flush_events()

    def _next_ready(self, now: float) -> float | None:
        times = [s.ready_at for s in self.waiting if s.status is Status.LOADING]
        return max(0.0, min(times) - now) if times else None

    def _flush_events(self) -> None:
        if self.on_events is not None and self.pool.events:
            self.on_events(self.pool.take_events())

    # ---- scheduling -------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.options.block_size)

    def _update_hashes(self, seq: Seq) -> None:
        bs = self.options.block_size
        full = len(seq.all_ids) // bs
        parent = seq.hashes[-1] if seq.hashes else None
        for i in range(len(seq.hashes), full):
            extra = extra_keys(seq.lora, seq.cache_salt, i)
            parent = block_hash(parent, seq.all_ids[i * bs : (i + 1) * bs], extra)
            seq.hashes.append(parent)

    def _schedule(self, now: float) -> Plan:
        o = self.options
        plan = Plan()
        budget = o.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(len(seq.all_ids) - seq.num_computed, budget)
            while True:
                need = self._blocks_for(seq.num_computed + n) - len(seq.blocks)
                if self.pool.can_allocate(need):
                    seq.blocks.extend(self.pool.allocate(max(0, need)))
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    n = 0
                    break
            if n == 0:
                break
            self._add(plan, seq, n)
            budget -= n
            i += 1
        if not preempted:
            self._schedule_waiting(plan, budget, now)
        return plan

    def _add(self, plan: Plan, seq: Seq, n: int) -> None:
        plan.items.append((seq, n))
        decoding = n == 1 and seq.num_output > 0 and seq.num_computed == len(seq.all_ids) - 1
        if decoding:
            plan.decode_seqs += 1
            plan.context_tokens += seq.num_computed
        else:
            plan.prefill_tokens += n

    def _schedule_waiting(self, plan: Plan, budget: int, now: float) -> None:
        o = self.options
        skipped: list[Seq] = []
        in_use = {s.lora for s in self.running if s.lora}
        while self.waiting and budget > 0 and len(self.running) < o.max_num_seqs:
            seq = self.waiting[0]
            if seq.status is Status.LOADING:
                if now < seq.ready_at:
                    skipped.append(self.waiting.popleft())
                    continue
                self._finish_load(seq)
            if seq.lora and not self.loras.can_use(seq.lora, in_use):
                skipped.append(self.waiting.popleft())
                continue
            if seq.encode_only:
                self.waiting.popleft()
                self._admit(seq, now)
                plan.items.append((seq, 0))
                plan.extra += self._encode_cost(seq)
                continue
            computed: list[Block] = []
            fresh = not seq.blocks
            if fresh:
                self._update_hashes(seq)
                max_hit = (len(seq.all_ids) - 1) // o.block_size
                computed = self.pool.lookup(seq.hashes[:max_hit])
                hit_tokens = len(computed) * o.block_size
                ext, cost = self._external_tokens(seq, hit_tokens, max_hit, len(computed))
                if ext:
                    need = self._blocks_for(hit_tokens + ext) - len(computed)
                    if not self.pool.can_allocate(need, computed):
                        if self.running:
                            break
                        skipped.append(self.waiting.popleft())
                        continue
                    self.waiting.popleft()
                    seq.remote_prefill = False  # a preempted request recomputes
                    self._count_prefix(seq, hit_tokens)
                    self.pool.take(computed)
                    seq.blocks = computed + self.pool.allocate(need)
                    seq.num_computed = hit_tokens
                    seq.num_cached_blocks = len(computed)
                    seq.ext_tokens = ext
                    if seq.first_scheduled is None:
                        seq.cached_tokens = hit_tokens + ext
                    seq.ready_at = now + cost * o.time_scale
                    seq.status = Status.LOADING
                    skipped.append(seq)
                    continue
                seq.num_computed = hit_tokens
            n = min(len(seq.all_ids) - seq.num_computed, budget)
            need = self._blocks_for(seq.num_computed + n) - len(seq.blocks) - len(computed)
            if not self.pool.can_allocate(need, computed):
                if fresh:
                    seq.num_computed = 0
                if self.running:
                    break  # FIFO: wait for running requests to free blocks
                # Nothing runs, so nothing will free blocks: let the requests behind that
                # already hold blocks (KV loaded from elsewhere) go first.
                skipped.append(self.waiting.popleft())
                continue
            self.waiting.popleft()
            if fresh:
                seq.remote_prefill = False
                self._count_prefix(seq, seq.num_computed)
                if seq.first_scheduled is None:  # usage reports the first admission's hits
                    seq.cached_tokens = seq.num_computed
                self.pool.take(computed)
                seq.blocks = list(computed)
                seq.num_cached_blocks = len(computed)
            seq.blocks.extend(self.pool.allocate(need))
            if seq.lora:
                if self.loras.use(seq.lora, in_use):
                    plan.extra += o.lora_load_time
                in_use.add(seq.lora)
            if not seq.encoded:
                plan.extra += self._encode_cost(seq)
            self._admit(seq, now)
            self._add(plan, seq, n)
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def _admit(self, seq: Seq, now: float) -> None:
        seq.status = Status.RUNNING
        if seq.first_scheduled is None:
            seq.first_scheduled = now
            self.stats.queue.observe(now - seq.arrival)
        self.running.append(seq)

    def _count_prefix(self, seq: Seq, hit_tokens: int) -> None:
        if self.options.enable_prefix_caching:
            self.stats.prefix_queries += len(seq.all_ids)
            self.stats.prefix_hits += hit_tokens

    def _external_tokens(
        self, seq: Seq, hit_tokens: int, max_hit: int, hit_blocks: int
    ) -> tuple[int, float]:
        """Tokens (and the transfer time) a fresh request loads instead of computing."""
        o = self.options
        if seq.remote_prefill:
            # The prefill pod computed the prompt; the last token is recomputed here.
            ext = max(0, seq.prompt_len - 1 - hit_tokens)
            return ext, self._blocks_for(ext) * o.kv_transfer_cost_per_block
        if o.cpu_offload_blocks > 0 and o.enable_prefix_caching:
            n = self.pool.cpu_lookup(seq.hashes[hit_blocks:max_hit])
            return n * o.block_size, n * o.cpu_load_cost_per_block
        return 0, 0.0

    def _finish_load(self, seq: Seq) -> None:
        seq.num_computed += seq.ext_tokens
        seq.ext_tokens = 0
        seq.status = Status.WAITING
        self._cache_full_blocks(seq)

    def _encode_cost(self, seq: Seq) -> float:
        cost = 0.0
        for item in seq.mm:
            if item.mm_hash in self.encoder_cache:
                self.encoder_cache.move_to_end(item.mm_hash)
                continue
            if item.mm_hash not in seq.remote_encoded or seq.encode_only:
                cost += self.options.encode_cost_per_item * (4 if item.kind == "video" else 1)
            self.encoder_cache[item.mm_hash] = None
            if len(self.encoder_cache) > self.encoder_cache_size:
                self.encoder_cache.popitem(last=False)
        seq.encoded = True
        return cost

    def _release(self, seq: Seq) -> None:
        if seq.blocks:
            self.pool.free(seq.blocks)
            seq.blocks = []

    def _preempt(self, seq: Seq) -> None:
        self._release(seq)
        seq.num_computed = 0
        seq.num_cached_blocks = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1

    # ---- after a step -----------------------------------------------------------------
    def _cache_full_blocks(self, seq: Seq) -> None:
        if not self.options.enable_prefix_caching:
            return
        bs = self.options.block_size
        full = seq.num_computed // bs
        if full <= seq.num_cached_blocks:
            return
        self._update_hashes(seq)
        start = seq.num_cached_blocks
        self.pool.cache(
            seq.blocks[start:full],
            seq.hashes[start:full],
            seq.hashes[start - 1] if start else None,
            [seq.all_ids[k * bs : (k + 1) * bs] for k in range(start, full)],
            seq.lora_id,
            seq.lora,
            [extra_keys(seq.lora, seq.cache_salt, k) for k in range(start, full)],
        )
        seq.num_cached_blocks = full

    def _complete(self, plan: Plan, now: float) -> None:
        for seq, n in plan.items:
            if seq.status is not Status.RUNNING:
                continue  # aborted during the step
            if seq.encode_only:
                self._finish(seq, "length", now)
                continue
            seq.num_computed += n
            self._cache_full_blocks(seq)
            if seq.num_computed >= len(seq.all_ids):
                self._sample(seq, now)

    def _sample(self, seq: Seq, now: float) -> None:
        o = self.options
        word = seq.words.word(seq.num_output)
        self.stats.generation_tokens += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
            self.stats.prompt_tokens += seq.prompt_len
            self.stats.ttft.observe(now - seq.arrival)
        elif seq.last_token_at is not None:
            self.stats.tpot.observe(now - seq.last_token_at)
        seq.last_token_at = now
        if word in seq.stop:
            self._finish(seq, "stop", now)
            return
        seq.output_words.append(word)
        seq.all_ids.append(word_id(word))
        if seq.num_output >= seq.max_tokens or len(seq.all_ids) >= o.max_model_len:
            self._finish(seq, "length", now)
        else:
            seq.changed.set()

    def _finish(self, seq: Seq, reason: str, now: float) -> None:
        with contextlib.suppress(ValueError):
            self.running.remove(seq)
        if seq.prefill_only:
            seq.kv_transfer_out = [b.id for b in seq.blocks]
        self._release(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finished_at = now
        self.stats.success[reason] = self.stats.success.get(reason, 0) + 1
        self.stats.e2e.observe(now - seq.arrival)
        seq.changed.set()

    def describe(self) -> dict[str, Any]:
        """A snapshot for logs and tests."""
        return {
            "running": self.num_running,
            "waiting": self.num_waiting,
            "free_blocks": self.pool.num_free,
            "cached_blocks": self.pool.num_cached,
            "cpu_blocks": self.pool.num_cpu,
            "steps": self.stats.steps,
        }
