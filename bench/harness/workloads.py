"""Deterministic benchmark workloads: lists of timed OpenAI requests.

A workload is a list of `TimedRequest`s: when to send (seconds after the start), which API path,
the JSON body, and a tag (the request's class, for per-class statistics). Every generator is a
pure function of its parameters and a seed, so two runs of the same workload send byte-identical
requests at identical offsets, whatever router is in front of the pods.

Workloads:

* ``seed001``: the load-aware-routing benchmark of the reference document. Heavy "seed"
  requests are sent first to saturate the pods, then a jittered burst of short and medium
  completions, with one heavy request inlined every ``inline_every`` burst items. Heavy
  requests cycle through four (input words, output tokens) specs, so with 4 pods and
  round-robin every 4th (the super-heavy one) lands on the same pod.
* ``chat-prefix``: multi-turn chat. Users share a few long system prompts; each user's
  conversation grows turn by turn and every turn resends the whole history, so a router that
  keeps a conversation (and a system prompt) on one pod gets prefix-cache hits.
* ``context-mix``: completions with short, medium and very long prompts arriving as a Poisson
  process, for context-length-aware routing.
* ``mooncake-conversation`` and ``mooncake-synthetic``: Mooncake's FAST'25 traces replayed
  (bench/traces/README.md): every hash id one fixed text block, so prompts share exactly the
  prefixes the trace says; time scaled to a target utilisation of the pods.
* ``shared-prefix``: inference-perf's shared-prefix workload (groups of users sharing a
  system prompt, each asking a question, optionally over several rounds), time likewise scaled.

``*-small`` presets are scaled-down versions sized for a simulated fleet on a 2-core machine.

Run ``python -m bench.harness.workloads --workload seed001`` to print a summary (``--list`` for the
presets, ``--dump FILE`` to write the requests as JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import cli, traces
from bench.harness.costs import SLOTS, pod_work
from heimdall_proxy.sim.options import SimOptions

DEFAULT_MODEL = "sim-model"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

# Words the prompts are made of: short common words of at most 4 letters, so one word is about
# one token both for a real BPE tokenizer and for the simulator (which cuts unknown words into
# 4-character pieces). "Input words" therefore read as input tokens, and a 4000-word heavy
# prompt plus its 1050 output tokens fits the simulator's default 8192-token context.
_VOCAB_TEXT = (
    "data load node time fast slow cache page disk core link path host port peer edge zone "
    "rack lane gate hop run send read keep drop hit miss warm cold pick fill wait list tree "
    "heap map set key byte bit word line file task job plan step loop call code test unit "
    "case flag mode rate cost size rank"
)
VOCAB = tuple(_VOCAB_TEXT.split())


@dataclass(frozen=True, slots=True)
class TimedRequest:
    """One request of a workload: send `body` to `path` at `offset` seconds after the start."""

    id: str
    offset: float
    path: str
    body: dict[str, Any]
    tag: str
    headers: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "offset": self.offset,
            "path": self.path,
            "tag": self.tag,
            "body": self.body,
        }
        if self.headers:
            doc["headers"] = self.headers
        return doc


@dataclass(slots=True)
class Workload:
    """A named list of timed requests plus the parameters that produced it."""

    name: str
    params: dict[str, Any]
    requests: list[TimedRequest]

    @property
    def duration(self) -> float:
        """Offset of the last request (the send schedule's length, not the run's)."""
        return max((r.offset for r in self.requests), default=0.0)

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.tag for r in self.requests))

    def scaled(self, time_scale: float) -> Workload:
        """The same requests with every offset multiplied by `time_scale`."""
        if time_scale == 1.0:
            return self
        reqs = [dataclasses.replace(r, offset=r.offset * time_scale) for r in self.requests]
        return Workload(self.name, {**self.params, "time_scale": time_scale}, reqs)

    def describe(self) -> str:
        counts = ", ".join(f"{tag} {n}" for tag, n in sorted(self.counts().items()))
        return (
            f"{self.name}: {len(self.requests)} requests ({counts}); "
            f"last send at {self.duration:.1f}s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params,
            "requests": [r.to_json() for r in self.requests],
        }


# ---- text -------------------------------------------------------------------------------


def words_text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choices(VOCAB, k=max(0, n_words)))


def chars_text(rng: random.Random, n_chars: int) -> str:
    """About `n_chars` characters of words (about n_chars / 4 tokens by the 4-char rule)."""
    # Mean word length is ~3.7 characters plus a space; draw a little more than needed, then cut.
    out = words_text(rng, n_chars // 4 + 8)
    while len(out) < n_chars:
        out += " " + words_text(rng, 32)
    return out[:n_chars].rstrip()


def _rng(seed: int, *parts: object) -> random.Random:
    # String seeds are hashed with SHA-512 by `random`, so this is stable across runs and
    # Python processes (unlike hash()).
    return random.Random(":".join([str(seed), *map(str, parts)]))


def _sampling(osl: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": osl,
        "temperature": 0,
        "top_p": 1,
        # vLLM extension: generate exactly max_tokens, so a real pod does the work we asked for.
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


# ---- seed 001: heavy seeds, then a jittered burst with inline heavies ----------------------

HEAVY_SPECS: tuple[tuple[int, int], ...] = ((1300, 320), (1500, 350), (2700, 780), (4000, 1050))


@dataclass(frozen=True)
class Seed001Params:
    """The reference benchmark's knobs; defaults are the parameters of its published run."""

    total: int = 800
    heavy_seeds: int = 400
    inline_every: int = 24
    #: explicit number of inline heavies; 0 derives it from `inline_every`
    inline_heavy_count: int = 0
    seed_interval: float = 0.0
    burst_start: float = 5.0
    burst_interval: float = 0.5
    jitter: float = 0.5
    inline_extra_gap: float = 0.5
    #: (input words, output tokens), cycled in order by seeds and by inline heavies
    heavy_specs: tuple[tuple[int, int], ...] = HEAVY_SPECS
    short_isl: tuple[int, int] = (10, 20)
    short_osl: tuple[int, int] = (25, 40)
    medium_isl: tuple[int, int] = (120, 180)
    medium_osl: tuple[int, int] = (60, 90)
    #: Stream the heavy requests too. Off by default: the short and medium burst requests are
    #: the ones whose TTFT shows routing quality, while the heavies carry ~95% of the output
    #: tokens, and relaying them chunk by chunk would make a 2-core benchmark measure the
    #: client's and the relays' CPU rather than the routing (their E2E is measured either way).
    stream_heavy: bool = False


def seed001_layout(p: Seed001Params, seed: int) -> list[tuple[str, int, int]]:
    """The request sequence as (kind, input words, output tokens), kinds "heavy-seed",
    "short", "medium", "heavy-inline", in send order."""
    rng = _rng(seed, "seed001", "layout")
    heavy_seeds = max(0, min(p.heavy_seeds, p.total))
    out = [("heavy-seed", *p.heavy_specs[i % len(p.heavy_specs)]) for i in range(heavy_seeds)]
    remaining = p.total - heavy_seeds
    if p.inline_heavy_count > 0:
        n_inline = min(p.inline_heavy_count, remaining)
    else:
        n_inline = remaining // (p.inline_every + 1) if p.inline_every > 0 else 0
    n_plain = remaining - n_inline
    n_short = n_plain // 2
    pool = [("short", rng.randint(*p.short_isl), rng.randint(*p.short_osl)) for _ in range(n_short)]
    pool += [
        ("medium", rng.randint(*p.medium_isl), rng.randint(*p.medium_osl))
        for _ in range(n_plain - n_short)
    ]
    rng.shuffle(pool)
    # One inline heavy after every `step` burst items, spread over the whole burst; any that
    # do not fit (more heavies than burst items) go at the end.
    step = max(1, len(pool) // n_inline) if n_inline else 0
    burst: list[tuple[str, int, int]] = []
    placed = 0
    for idx, item in enumerate(pool, start=1):
        burst.append(item)
        if placed < n_inline and idx == (placed + 1) * step:
            burst.append(("heavy-inline", *p.heavy_specs[placed % len(p.heavy_specs)]))
            placed += 1
    for k in range(placed, n_inline):
        burst.append(("heavy-inline", *p.heavy_specs[k % len(p.heavy_specs)]))
    return out + burst


def seed001_offsets(p: Seed001Params, kinds: Sequence[str], seed: int) -> list[float]:
    """Send offsets: seeds every `seed_interval` from 0; the burst from `burst_start`, spaced
    `burst_interval` +/- uniform `jitter` (never negative), plus `inline_extra_gap` after each
    inline heavy."""
    rng = _rng(seed, "seed001", "timing")
    offsets: list[float] = []
    n_seed = 0
    t = p.burst_start
    for kind in kinds:
        if kind == "heavy-seed":
            offsets.append(n_seed * p.seed_interval)
            n_seed += 1
            continue
        offsets.append(t)
        dt = p.burst_interval + (rng.uniform(-p.jitter, p.jitter) if p.jitter > 0 else 0.0)
        if kind == "heavy-inline":
            dt += p.inline_extra_gap
        t += max(0.0, dt)
    return offsets


def seed001(
    params: Seed001Params | None = None,
    *,
    seed: int = 42,
    model: str = DEFAULT_MODEL,
    stream: bool = True,
    name: str = "seed001",
) -> Workload:
    p = params or Seed001Params()
    layout = seed001_layout(p, seed)
    offsets = seed001_offsets(p, [k for k, _, _ in layout], seed)
    per_kind: Counter[str] = Counter()
    requests = []
    for (kind, isl, osl), offset in zip(layout, offsets, strict=True):
        per_kind[kind] += 1
        rid = f"{kind}-{per_kind[kind]:04d}"
        # The id leads the prompt so no two requests share a prefix (as in the reference run).
        prompt = f"[{rid}] " + words_text(_rng(seed, rid), isl)
        streamed = stream and (p.stream_heavy or not kind.startswith("heavy"))
        body = {"model": model, "prompt": prompt, **_sampling(osl, streamed)}
        requests.append(TimedRequest(rid, round(offset, 6), COMPLETIONS, body, kind))
    return Workload(name, {"seed": seed, "model": model, **_params_json(p)}, requests)


# ---- multi-turn chat with shared system prompts -----------------------------------------


@dataclass(frozen=True)
class ChatPrefixParams:
    """Users in `system_prompts` groups share a long system prompt; each user holds one
    conversation of `turns` turns, and turn k resends the k-1 earlier exchanges."""

    users: int = 32
    system_prompts: int = 4
    system_words: int = 1500
    turns: int = 6
    user_words: tuple[int, int] = (20, 60)
    reply_tokens: tuple[int, int] = (40, 120)
    #: seconds between a user's turns (open loop: the next turn does not wait for the reply)
    think_time: tuple[float, float] = (4.0, 10.0)
    #: users start uniformly spread over [0, ramp] seconds
    ramp: float = 30.0


def chat_prefix(
    params: ChatPrefixParams | None = None,
    *,
    seed: int = 42,
    model: str = DEFAULT_MODEL,
    stream: bool = True,
    name: str = "chat-prefix",
) -> Workload:
    p = params or ChatPrefixParams()
    systems = [
        f"You are assistant #{g}. " + words_text(_rng(seed, "system", g), p.system_words)
        for g in range(max(1, p.system_prompts))
    ]
    requests: list[TimedRequest] = []
    for u in range(p.users):
        rng = _rng(seed, "user", u)
        history: list[dict[str, str]] = [{"role": "system", "content": systems[u % len(systems)]}]
        t = rng.uniform(0.0, p.ramp)
        for turn in range(1, p.turns + 1):
            history.append(
                {
                    "role": "user",
                    "content": f"(user {u} turn {turn}) "
                    + words_text(rng, rng.randint(*p.user_words)),
                }
            )
            osl = rng.randint(*p.reply_tokens)
            body = {"model": model, "messages": list(history), **_sampling(osl, stream)}
            rid = f"u{u:03d}-t{turn:02d}"
            tag = "first-turn" if turn == 1 else "follow-up"
            requests.append(TimedRequest(rid, round(t, 6), CHAT, body, tag))
            # The reply is not known open-loop: resend a stand-in of the requested length, as a
            # client replaying a recorded conversation would.
            history.append({"role": "assistant", "content": words_text(rng, osl)})
            t += rng.uniform(*p.think_time)
    requests.sort(key=lambda r: (r.offset, r.id))
    return Workload(name, {"seed": seed, "model": model, **_params_json(p)}, requests)


# ---- mixed context lengths ----------------------------------------------------------------


@dataclass(frozen=True)
class ContextMixParams:
    """Completions whose prompt lengths (in 4-character tokens) fall in three bands, arriving
    as a Poisson process of `rate` requests per second."""

    requests: int = 300
    rate: float = 4.0
    #: fractions of short, medium and long prompts (normalised)
    mix: tuple[float, float, float] = (0.6, 0.3, 0.1)
    short_tokens: tuple[int, int] = (64, 512)
    medium_tokens: tuple[int, int] = (1024, 2048)
    long_tokens: tuple[int, int] = (4096, 7168)
    output_tokens: tuple[int, int] = (32, 128)


def context_mix(
    params: ContextMixParams | None = None,
    *,
    seed: int = 42,
    model: str = DEFAULT_MODEL,
    stream: bool = True,
    name: str = "context-mix",
) -> Workload:
    p = params or ContextMixParams()
    rng = _rng(seed, "context-mix")
    bands = (("short", p.short_tokens), ("medium", p.medium_tokens), ("long", p.long_tokens))
    weights = [max(0.0, w) for w in p.mix]
    requests = []
    t = 0.0
    per_kind: Counter[str] = Counter()
    for _ in range(p.requests):
        kind, band = rng.choices(bands, weights=weights)[0]
        per_kind[kind] += 1
        rid = f"{kind}-{per_kind[kind]:04d}"
        tokens = rng.randint(*band)
        osl = rng.randint(*p.output_tokens)
        prefix = f"[{rid}] "
        prompt = prefix + chars_text(_rng(seed, rid), 4 * tokens - len(prefix))
        body = {"model": model, "prompt": prompt, **_sampling(osl, stream)}
        requests.append(TimedRequest(rid, round(t, 6), COMPLETIONS, body, kind))
        t += rng.expovariate(p.rate) if p.rate > 0 else 0.0
    return Workload(name, {"seed": seed, "model": model, **_params_json(p)}, requests)


# ---- hot prefix: skewed popularity over a few long system prompts -------------------------


@dataclass(frozen=True)
class HotPrefixParams:
    """Single-turn chats over `system_prompts` long system prompts whose popularity is skewed:
    the first takes `hot_share` of the requests, the rest share the remainder evenly. Each
    request adds its own short user message. Poisson arrivals at `rate` per second: set it
    near the fleet's capacity, where piling the hot prompt onto one pod hurts."""

    requests: int = 240
    rate: float = 6.0
    system_prompts: int = 5
    hot_share: float = 0.5
    system_words: int = 1200
    user_words: tuple[int, int] = (10, 40)
    reply_tokens: tuple[int, int] = (40, 120)


def hot_prefix(
    params: HotPrefixParams | None = None,
    *,
    seed: int = 42,
    model: str = DEFAULT_MODEL,
    stream: bool = True,
    name: str = "hot-prefix",
) -> Workload:
    p = params or HotPrefixParams()
    n = max(1, p.system_prompts)
    systems = [
        f"You are agent #{g}. " + words_text(_rng(seed, "hot-system", g), p.system_words)
        for g in range(n)
    ]
    cold = (1.0 - p.hot_share) / (n - 1) if n > 1 else 0.0
    weights = [p.hot_share] + [cold] * (n - 1)
    rng = _rng(seed, "hot-prefix")
    requests = []
    t = 0.0
    for i in range(p.requests):
        g = rng.choices(range(n), weights=weights)[0]
        user = f"(request {i}) " + words_text(rng, rng.randint(*p.user_words))
        messages = [{"role": "system", "content": systems[g]}, {"role": "user", "content": user}]
        osl = rng.randint(*p.reply_tokens)
        body = {"model": model, "messages": messages, **_sampling(osl, stream)}
        tag = "hot" if g == 0 else "other"
        requests.append(TimedRequest(f"h{i:04d}", round(t, 6), CHAT, body, tag))
        t += rng.expovariate(p.rate) if p.rate > 0 else 0.0
    return Workload(name, {"seed": seed, "model": model, **_params_json(p)}, requests)


# ---- mixed: long and short contexts, sessions, LoRA adapters --------------------------------


@dataclass(frozen=True)
class MixedParams:
    """A mixed tenant population: `sessions` multi-turn chat sessions (x-session-token set,
    each pinned to the base model or one of the `adapters`) interleaved with one-off
    completions of short and long prompts; Poisson arrivals at `rate` per second overall."""

    requests: int = 240
    rate: float = 5.0
    sessions: int = 24
    session_share: float = 0.5
    adapters: tuple[str, ...] = ("lora-a", "lora-b")
    system_words: int = 600
    long_share: float = 0.2
    short_tokens: tuple[int, int] = (64, 512)
    long_tokens: tuple[int, int] = (3000, 6000)
    reply_tokens: tuple[int, int] = (30, 150)


def mixed(
    params: MixedParams | None = None,
    *,
    seed: int = 42,
    model: str = DEFAULT_MODEL,
    stream: bool = True,
    name: str = "mixed",
) -> Workload:
    p = params or MixedParams()
    rng = _rng(seed, "mixed")
    models = [model, *p.adapters]
    histories: list[list[dict[str, str]]] = []
    for s in range(max(1, p.sessions)):
        system = f"Session {s} assistant. " + words_text(_rng(seed, "mixed-sys", s), p.system_words)
        histories.append([{"role": "system", "content": system}])
    requests = []
    t = 0.0
    for i in range(p.requests):
        osl = rng.randint(*p.reply_tokens)
        if rng.random() < p.session_share:
            s = rng.randrange(len(histories))
            history = histories[s]
            history.append({"role": "user", "content": words_text(rng, rng.randint(10, 40))})
            body = {"model": models[s % len(models)], "messages": list(history)}
            history.append({"role": "assistant", "content": words_text(rng, osl)})
            headers = {"x-session-token": f"session-{s}"}
            req = TimedRequest(f"m{i:04d}", round(t, 6), CHAT, {**body, **_sampling(osl, stream)},
                               "session", headers)  # fmt: skip
        else:
            long = rng.random() < p.long_share
            tokens = rng.randint(*(p.long_tokens if long else p.short_tokens))
            prefix = f"[m{i}] "
            prompt = prefix + chars_text(_rng(seed, "mixed-prompt", i), 4 * tokens - len(prefix))
            body = {"model": rng.choice(models), "prompt": prompt, **_sampling(osl, stream)}
            req = TimedRequest(f"m{i:04d}", round(t, 6), COMPLETIONS, body,
                               "long" if long else "short")  # fmt: skip
        requests.append(req)
        t += rng.expovariate(p.rate) if p.rate > 0 else 0.0
    return Workload(name, {"seed": seed, "model": model, **_params_json(p)}, requests)


# ---- time scaled to the pods' capacity -------------------------------------------------


def utilisation_span(
    jobs: Sequence[tuple[int, int, int]], utilisation: float, pods: int, slots: int = SLOTS
) -> float:
    """Seconds over which `jobs` (prompt tokens, tokens cached at best, output tokens) keep
    `pods` default simulated pods busy `utilisation` of the time: their pod work, by the
    cost model of the matrix's lower bound (bench/harness/costs.py), over the pods' capacity.
    A trace replayed over this span offers the pods that load on average (bursts above it)."""
    o = SimOptions()
    work = sum(pod_work(p, c, out, o, slots) for p, c, out in jobs)
    return work / (max(1e-9, utilisation) * max(1, pods))


# ---- Mooncake's traces ---------------------------------------------------------------------


@dataclass(frozen=True)
class MooncakeParams:
    """A Mooncake trace replayed: the committed sample of `trace` ("conversation" or
    "synthetic"), or the file at `path` (a full trace is sampled as the committed sample was,
    to `sample_requests` requests; 0 keeps it whole); its first `conversations` conversations
    (0: all); arrival times compressed so that the offered work is `utilisation` of `pods`
    pods' capacity (`utilisation_span`); `block_tokens` tokens per hash id."""

    trace: str = "conversation"
    path: str = ""
    sample_requests: int = traces.SAMPLE_REQUESTS
    conversations: int = 0
    utilisation: float = 0.8
    pods: int = 4
    block_tokens: int = traces.BLOCK_TOKENS


def trace_requests(p: MooncakeParams) -> list[traces.TraceRequest]:
    if p.path:
        reqs = traces.load(Path(p.path))
        if reqs and all(r.conversation < 0 for r in reqs):  # a full trace: sample it
            reqs = traces.sample(reqs, p.sample_requests or len(reqs))
    else:
        if p.trace not in traces.SAMPLES:
            raise ValueError(f"unknown trace {p.trace!r}; known: {', '.join(traces.SAMPLES)}")
        reqs = traces.load(traces.SAMPLES[p.trace])
    return traces.first_conversations(reqs, p.conversations)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    n %= 36**4
    while True:
        n, d = divmod(n, 36)
        out = digits[d] + out
        if not n:
            return out


class BlockTexts:
    """One fixed text per hash id: `block_tokens` words (one simulator token each), the id
    in base 36 and then VOCAB words drawn from a generator seeded by the trace's name and
    the id alone."""

    def __init__(self, name: str, block_tokens: int) -> None:
        self.name = name
        self.block_tokens = block_tokens
        self._words: dict[int, list[str]] = {}

    def words(self, hash_id: int) -> list[str]:
        w = self._words.get(hash_id)
        if w is None:
            # the id itself leads (base 36, at most 4 characters: one token), so two blocks
            # part on their first token, not on whichever word the draws first differ at
            rng = _rng(0, "trace-block", self.name, hash_id)
            w = [_base36(hash_id), *rng.choices(VOCAB, k=max(0, self.block_tokens - 1))]
            self._words[hash_id] = w
        return w

    def prompt(self, hash_ids: Sequence[int], input_length: int) -> str:
        """The blocks' texts in order, the last cut to the `input_length` the trace gives."""
        out: list[str] = []
        for h in hash_ids:
            room = input_length - len(out)
            if room <= 0:
                break
            out.extend(self.words(h)[:room])
        return " ".join(out)


def _trace_hits(reqs: Sequence[traces.TraceRequest], block_tokens: int) -> list[int]:
    """Tokens of each request computed before by some request (each block once, fleet-wide)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for r in reqs:
        hits = 0
        for k in range(1, len(r.hash_ids) + 1):
            key = r.hash_ids[:k]
            if key in seen and hits == k - 1:
                hits = k
            seen.add(key)
        out.append(min(hits * block_tokens, r.input_length))
    return out


def mooncake(
    params: MooncakeParams | None = None,
    *,
    seed: int = 42,
    model: str = DEFAULT_MODEL,
    stream: bool = True,
    name: str = "mooncake",
) -> Workload:
    """The trace's requests as completions (the seed is unused: the trace is the schedule)."""
    p = params or MooncakeParams()
    reqs = trace_requests(p)
    texts = BlockTexts(p.trace, p.block_tokens)  # a full trace replays as its sample does
    hits = _trace_hits(reqs, p.block_tokens)
    jobs = [(r.input_length, h, r.output_length) for r, h in zip(reqs, hits, strict=True)]
    span = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000 if reqs else 0.0
    scale = utilisation_span(jobs, p.utilisation, p.pods) / span if span > 0 else 1.0
    t0 = reqs[0].timestamp_ms if reqs else 0.0
    seen: set[int] = set()
    requests = []
    for i, r in enumerate(reqs):
        tag = "follow-up" if r.conversation in seen else "first-turn"
        seen.add(r.conversation)
        body = {
            "model": model,
            "prompt": texts.prompt(r.hash_ids, r.input_length),
            **_sampling(max(1, r.output_length), stream),
        }
        offset = (r.timestamp_ms - t0) / 1000 * scale
        requests.append(
            TimedRequest(f"c{r.conversation:04d}-{i:05d}", round(offset, 6), COMPLETIONS, body, tag)
        )
    meta = {"seed": seed, "model": model, "time_scale": scale, "trace_seconds": span}
    return Workload(name, {**meta, **_params_json(p)}, requests)


# ---- inference-perf's shared-prefix workload ---------------------------------------------


@dataclass(frozen=True)
class SharedPrefixParams:
    """inference-perf's shared-prefix data generator: `groups` system prompts of
    `system_prompt_len` tokens, `prompts_per_group` users per group each with one question
    of `question_len` tokens, `output_len` tokens out. Users are shuffled (seeded) and served
    in turn at a constant rate; with `multi_turn` each user is a session whose context (the
    system prompt at first) grows by its question and the reply's stand-in every round, for
    `rounds` rounds. `rate` 0 derives the rate from `utilisation` of `pods` pods."""

    groups: int = 8
    prompts_per_group: int = 12
    system_prompt_len: int = 2000
    question_len: int = 200
    output_len: int = 100
    multi_turn: bool = True
    rounds: int = 4
    rate: float = 0.0
    utilisation: float = 0.8
    pods: int = 4


def shared_prefix(
    params: SharedPrefixParams | None = None,
    *,
    seed: int = 42,
    model: str = DEFAULT_MODEL,
    stream: bool = True,
    name: str = "shared-prefix",
) -> Workload:
    p = params or SharedPrefixParams()
    systems = [words_text(_rng(seed, "sp-system", g), p.system_prompt_len) for g in range(p.groups)]
    users = [(g, u) for g in range(p.groups) for u in range(p.prompts_per_group)]
    _rng(seed, "sp-order").shuffle(users)
    questions = {gu: words_text(_rng(seed, "sp-question", *gu), p.question_len) for gu in users}
    context = {gu: systems[gu[0]] for gu in users}
    rounds = max(1, p.rounds) if p.multi_turn else 1
    plan: list[tuple[str, str, str, int, int]] = []  # id, prompt, tag, prompt and cached tokens
    seen_groups: set[int] = set()
    prev_len: dict[tuple[int, int], int] = {}
    for r in range(rounds):
        for gu in users:
            prompt = context[gu] + " " + questions[gu]
            tokens = len(prompt.split())
            if r and p.multi_turn:
                cached = prev_len[gu]
            else:
                cached = p.system_prompt_len if gu[0] in seen_groups else 0
            seen_groups.add(gu[0])
            prev_len[gu] = tokens
            tag = "first-round" if r == 0 else "follow-up"
            plan.append((f"g{gu[0]:02d}-u{gu[1]:03d}-r{r}", prompt, tag, tokens, cached))
            if p.multi_turn:
                reply = words_text(_rng(seed, "sp-reply", *gu, r), p.output_len)
                context[gu] = prompt + " " + reply
    if p.rate > 0:
        interval = 1.0 / p.rate
    else:
        jobs = [(tok, cached, p.output_len) for *_, tok, cached in plan]
        interval = utilisation_span(jobs, p.utilisation, p.pods) / max(1, len(plan))
    requests = [
        TimedRequest(rid, round(i * interval, 6), COMPLETIONS,
                     {"model": model, "prompt": prompt, **_sampling(p.output_len, stream)}, tag)
        for i, (rid, prompt, tag, _, _) in enumerate(plan)
    ]  # fmt: skip
    meta = {"seed": seed, "model": model, "interval": interval}
    return Workload(name, {**meta, **_params_json(p)}, requests)


# ---- presets and CLI ------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    builder: Callable[..., Workload]
    params: Any
    description: str
    #: flags the comparison passes to every simulated pod unless the user gives --sim-args
    sim_args: tuple[str, ...] = ()
    #: time scale the comparison applies by default (workload offsets and the simulator)
    time_scale: float = 1.0


PRESETS: dict[str, Preset] = {
    "seed001": Preset(
        seed001,
        Seed001Params(),
        "the reference run: 800 requests, 400 heavy seeds, inline heavy every 24",
    ),
    "seed001-small": Preset(
        seed001,
        Seed001Params(
            total=200,
            heavy_seeds=100,
            # 10 ms apart rather than all at once: the seeds then reach the router in order, so
            # round-robin deals every 4th (super-heavy) seed to the same pod, the imbalance the
            # reference's round-robin run showed. Sent all at t=0, connection set-up races
            # shuffle them and a multi-threaded router spreads the heavy specs at random.
            seed_interval=0.01,
            burst_start=2.5,
            burst_interval=0.25,
            jitter=0.25,
            inline_extra_gap=0.25,
        ),
        "seed001 for a simulated fleet: a quarter of the requests (100 heavy seeds 10 ms apart, "
        "4 inline heavies, 96 short/medium) at twice the burst rate, on KV-bound pods",
        # 1024 blocks x 16 = 16k tokens of KV per pod: the heavy seeds keep every pod
        # saturated (a waiting queue) through the whole burst, as the reference's 70B pods were.
        sim_args=("--num-gpu-blocks", "1024"),
    ),
    "chat-prefix": Preset(
        chat_prefix, ChatPrefixParams(), "32 users x 6 turns, 4 shared 1500-word system prompts"
    ),
    "chat-prefix-small": Preset(
        chat_prefix,
        ChatPrefixParams(users=16, turns=5, system_words=800, think_time=(2.0, 5.0), ramp=10.0),
        "16 users x 5 turns, 4 shared 800-word system prompts",
    ),
    "hot-prefix": Preset(
        hot_prefix,
        HotPrefixParams(),
        "240 single-turn chats over 5 system prompts, one taking half, 6 req/s",
    ),
    "mixed": Preset(
        mixed,
        MixedParams(),
        "240 requests: sessions on a base model and two LoRA adapters, short and long prompts",
        sim_args=("--lora-modules", "lora-a,lora-b", "--max-loras", "1"),
    ),
    "context-mix": Preset(
        context_mix, ContextMixParams(), "300 completions, 60/30/10 short/medium/long, 4 req/s"
    ),
    "mooncake-conversation": Preset(
        mooncake,
        MooncakeParams("conversation"),
        "Mooncake's FAST'25 conversation trace, the committed sample of whole conversations, "
        "time scaled to 80% of 4 pods",
    ),
    "mooncake-synthetic": Preset(
        mooncake,
        MooncakeParams("synthetic"),
        "Mooncake's FAST'25 synthetic trace, the committed sample, time scaled to 80% of 4 pods",
    ),
    "shared-prefix": Preset(
        shared_prefix,
        SharedPrefixParams(),
        "inference-perf's shared prefix: 8 groups x 12 users, 2000-token system prompts, "
        "4 rounds, 80% of 4 pods",
    ),
    "context-mix-small": Preset(
        context_mix,
        ContextMixParams(requests=120),
        "120 completions, 60/30/10 short/medium/long, 4 req/s",
    ),
}

# The reference workload's own CLI flags, accepted for the seed001 presets.
SEED001_FLAGS: dict[str, type] = {
    "total": int,
    "heavy_seeds": int,
    "inline_every": int,
    "inline_heavy_count": int,
    "seed_interval": float,
    "burst_start": float,
    "burst_interval": float,
    "jitter": float,
    "inline_extra_gap": float,
}


def _params_json(p: Any) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(p).items()}


def _coerce(current: Any, text: str) -> Any:
    if isinstance(current, bool):
        return text.lower() in ("1", "true", "yes", "on")
    if isinstance(current, int):
        return int(text)
    if isinstance(current, float):
        return float(text)
    if isinstance(current, tuple):
        parsed = json.loads(text if text.startswith("[") else f"[{text}]")
        return tuple(tuple(x) if isinstance(x, list) else x for x in parsed)
    return text


def apply_overrides(params: Any, overrides: dict[str, str]) -> Any:
    """A copy of a params dataclass with `name=text` overrides parsed to each field's type."""
    fields = {f.name for f in dataclasses.fields(params)}
    changes = {}
    for key, text in overrides.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise ValueError(
                f"unknown parameter {key!r} for {type(params).__name__}; "
                f"known: {', '.join(sorted(fields))}"
            )
        changes[name] = _coerce(getattr(params, name), text)
    return dataclasses.replace(params, **changes)


def build(
    name: str,
    *,
    seed: int = 42,
    model: str = DEFAULT_MODEL,
    stream: bool = True,
    overrides: dict[str, str] | None = None,
) -> Workload:
    """Build a preset by name, with optional `field=value` overrides of its parameters."""
    try:
        preset = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(PRESETS)}") from None
    params = apply_overrides(preset.params, overrides or {})
    return preset.builder(params, seed=seed, model=model, stream=stream, name=name)


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The workload flags shared by the workloads, runner and compare entry points."""
    g = parser.add_argument_group("workload")
    g.add_argument("--workload", "-w", default="seed001-small", choices=sorted(PRESETS))
    cli.add_seed(g)
    g.add_argument("--model", default=DEFAULT_MODEL)
    g.add_argument(
        "--no-stream", action="store_true", help="send stream=false (no TTFT is measured)"
    )
    g.add_argument(
        "--param",
        "-P",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a workload parameter, e.g. -P users=8 -P think_time=1,3",
    )
    for flag, kind in SEED001_FLAGS.items():
        g.add_argument(
            "--" + flag.replace("_", "-"),
            type=kind,
            default=None,
            help=argparse.SUPPRESS if flag != "total" else "seed001 flags as in the reference",
        )


def workload_from_args(args: argparse.Namespace) -> Workload:
    overrides: dict[str, str] = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--param takes NAME=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    for flag in SEED001_FLAGS:
        value = getattr(args, flag, None)
        if value is not None:
            if PRESETS[args.workload].builder is not seed001:
                raise ValueError(f"--{flag.replace('_', '-')} applies to the seed001 workloads")
            overrides[flag] = str(value)
    return build(
        args.workload,
        seed=args.seed,
        model=args.model,
        stream=not args.no_stream,
        overrides=overrides,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    add_workload_args(parser)
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every offset")
    parser.add_argument("--dump", metavar="FILE", help="write the workload as JSON")
    parser.add_argument("--list", action="store_true", help="list the presets")
    args = parser.parse_args(argv)
    if args.list:
        for name, preset in PRESETS.items():
            print(f"{name:20s} {preset.description}")
        return 0
    try:
        wl = workload_from_args(args).scaled(args.time_scale)
    except ValueError as exc:
        parser.error(str(exc))
    print(wl.describe())
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as f:
            json.dump(wl.to_json(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
