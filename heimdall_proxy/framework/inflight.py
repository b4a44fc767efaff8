"""The gateway's one in-flight ledger: what it has sent each pod and not yet seen finish.

One `InFlightLoad` per gateway process, kept across reloads. The relay feeds it once per
attempt: `acquire` when the attempt starts (the request, and the tokens the pod must work
through: its uncached prompt, plus an output estimate when `inflight-load-producer` asks
for one), `prompt_done` at a stream's first chunk (prefill is over: the prompt tokens are
released), `release` when the attempt ends, whatever ended it. Scraped metrics lag by up to
a scrape interval; the ledger does not, so scorers, filters and saturation detectors read
it (each keeps no count of its own), and a burst cannot slip past a detector between scrapes.

Entries older than `timeout` are dropped by `expire` (a completion that never came must not
pin a count); a consumer with a shorter horizon of its own (active-request-scorer's
`requestTimeout`) counts with `requests_since`.

What is learned from the ledger's data lives in it too: the per-pod queue price
(queue_price.py, `queue_price`) and each pod's pace (pace.py, `pace`: time to first chunk
and per output token of the streams that ran to their end there), fed from the same three
calls, so each is learned once per attempt whichever plugins read it, outlives reloads and
forgets the pods that leave."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, KeysView, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Protocol, runtime_checkable

from heimdall_proxy.framework.pace import Pace
from heimdall_proxy.framework.prefix import MatchReader, prefix_match_reader
from heimdall_proxy.framework.queue_price import QueuePrice
from heimdall_proxy.framework.types import Metrics, RequestContext

#: Where the match that discounts the prompt is found by default: the default-named
#: approx-prefix-cache-producer's.
DEFAULT_MATCH = prefix_match_reader()

log = logging.getLogger(__name__)

#: How long an attempt counts at most when its end is never seen (the relay always reports
#: it; this only bounds a bug's damage). Long generations run for minutes.
DEFAULT_TIMEOUT = 600.0

#: Models remembered per pod (`recent_models`): more than vLLM's adapter slots on a pod.
RECENT_MODELS = 8


@dataclass(slots=True)
class Attempt:
    """One attempt in flight, as the ledger counts it."""

    pod: str
    start: float
    #: prompt tokens still counted (0 once the first chunk came) and output tokens counted
    prompt: int
    output: int
    #: the whole prompt's tokens, cached or not, counted until the end
    whole: int
    #: the relay's context of the attempt (its request, and the chunks streamed so far), when
    #: the relay sent it; None for the ledger's other callers (a disaggregated hop)
    ctx: RequestContext | None = None
    #: at its first chunk: this gateway's streams decoding on the pod (itself included), and
    #: the pod's count of prefilled prompt tokens (what its pace is learned against)
    peers_at_first: int = 0
    prefilled_at_first: int = 0


class Measure:
    """A value a consumer keeps per attempt in flight (outstanding-work-scorer's work left),
    summed per pod. It lives in the ledger, so an attempt's value goes when the attempt
    does (release, expiry, its pod leaving) and a reload finds it under the same name."""

    __slots__ = ("_counts", "_ledger", "_others", "_totals", "_values")

    def __init__(self, ledger: InFlightLoad | None = None) -> None:
        #: The ledger it lives in (told of each change, to publish it when shared).
        self._ledger = ledger
        self._values: dict[str, tuple[str, float]] = {}
        self._totals: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        #: pod -> the other gateway replicas' totals, when the ledger is shared
        self._others: dict[str, float] = {}

    def put(self, key: str, pod: str, value: float) -> None:
        """Attempt `key`'s value on `pod` (added, or changed)."""
        old = self._values.get(key)
        self._values[key] = (pod, value)
        if old is None:
            self._counts[pod] = self._counts.get(pod, 0) + 1
            delta = value
        else:
            delta = value - old[1]
        left = self._totals.get(pod, 0.0) + delta
        self._totals[pod] = left if left > 0.0 else 0.0
        if self._ledger is not None and self._ledger.poke is not None:
            self._ledger.poke()

    def drop(self, key: str) -> None:
        item = self._values.pop(key, None)
        if item is None:
            return
        pod, value = item
        n = self._counts.get(pod, 0) - 1
        if n > 0:
            self._counts[pod] = n
            left = self._totals.get(pod, 0.0) - value
            self._totals[pod] = left if left > 0.0 else 0.0
        else:  # exact zero, never float residue
            self._counts.pop(pod, None)
            self._totals.pop(pod, None)
        if self._ledger is not None and self._ledger.poke is not None:
            self._ledger.poke()

    def total(self, pod: str) -> float:
        """The values on `pod`, summed over every gateway replica when the ledger is shared."""
        if self._others:
            return self._totals.get(pod, 0.0) + self._others.get(pod, 0.0)
        return self._totals.get(pod, 0.0)

    def totals_of(self, pods: Iterable[str]) -> list[float]:
        """`total(pod)` of each of `pods`, in order, without a call per pod."""
        if self._others:
            return list(map(self.total, pods))
        return list(map(self._totals.get, pods, repeat(0.0)))

    def totals(self) -> dict[str, float]:
        """pod -> sum of this replica's values (what it publishes to the others)."""
        return {pod: total for pod, total in self._totals.items() if total}

    def forget(self, pods: Iterable[str]) -> None:
        gone = frozenset(pods)
        for key in [k for k, (pod, _) in self._values.items() if pod in gone]:
            del self._values[key]
        for pod in gone:
            self._totals.pop(pod, None)
            self._counts.pop(pod, None)
            self._others.pop(pod, None)


class InFlightLoad:
    """Per pod: requests and tokens in flight through this gateway, plus the admitted
    requests not yet sent (`pending`). Single-threaded (the event loop), so plain counters;
    read them through `requests`, `tokens` (what the pod must still compute of the prompts,
    and estimated output) and `prompts` (whole prompts of the requests in flight, until
    each ends: how much a pod is serving, as the affinity filter and the latency producer
    weigh it); pod -> count, absent: 0.

    When the ledger is shared between gateway replicas (`share_others`, fed by
    replicas/ledger.py), those three and every Measure's totals are the sums over every
    live replica, so a reader never asks where a count comes from; `own_requests`,
    `own_tokens` and `own_prompts` are this replica's alone (what it publishes, and its
    metrics). Unshared, each `own_*` is the same dict as its sum."""

    __slots__ = (
        "_attempts",
        "_by_pod",
        "_earliest",
        "_full",
        "_full_fleet",
        "_last_queue",
        "_measures",
        "_others",
        "_paces",
        "_prefilled",
        "_prices",
        "_ran",
        "_recent",
        "_senders",
        "_split",
        "count_tokens",
        "own_prompts",
        "own_requests",
        "own_tokens",
        "pending",
        "poke",
        "prompts",
        "requests",
        "sent",
        "share",
        "timeout",
        "tokens",
    )

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.requests: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.prompts: dict[str, int] = {}
        self.own_requests = self.requests
        self.own_tokens = self.tokens
        self.own_prompts = self.prompts
        #: Whether the sums are dicts of their own (the others' counts are in them).
        self._split = False
        #: series ("r", "t", "p", "m:<measure>") -> pod -> the other replicas' sum
        self._others: dict[str, dict[str, float]] = {}
        #: The replica sharing of this ledger (replicas/ledger.py `share_of`; the framework
        #: does not know the store), made on first use.
        self.share: object | None = None
        #: Called when a count changed while shared (the others hear of it soon; no I/O).
        self.poke: Callable[[], None] | None = None
        self.timeout = timeout
        #: Whether anything reads `tokens`. Until then the relay does not estimate a request's
        #: prompt tokens for the ledger: that walks the messages, and with the EPP's default
        #: plugins nothing else does.
        self.count_tokens = False
        #: Admitted by flow control, not yet sent to a pod.
        self.pending = 0
        #: Requests ever sent to each pod: the data layer compares it between scrapes to
        #: tell a pod nobody has touched (datalayer/cadence.py).
        self.sent: dict[str, int] = {}
        #: Told the pod's name whenever work is sent to it (`on_send`).
        self._senders: tuple[Callable[[str], None], ...] = ()
        self._attempts: dict[str, Attempt] = {}
        self._measures: dict[str, Measure] = {}
        #: pod -> its pace, from the streams that ran to their end there
        self._paces: dict[str, Pace] = {}
        #: pod -> uncached prompt tokens of this gateway's attempts there that reached their
        #: first chunk (prefilled), ever: what a stream's tokens shared their steps with
        self._prefilled: dict[str, int] = {}
        #: pod -> the models (base or adapter) of the attempts that began to answer there, least
        #: recent first, the last RECENT_MODELS of them: which LoRA adapters it most likely
        #: holds (an adapter is loaded when its request runs, not when it is sent)
        self._recent: dict[str, dict[str, None]] = {}
        #: pod -> how many requests its engine runs at once, as its scrapes showed it: the
        #: count running while requests waited, in two scrapes in a row (`scraped`)
        self._full: dict[str, int] = {}
        #: the count last seen full on any pod: what a pod not yet seen full is taken to run
        #: (a fleet's pods are mostly alike), unless its scrapes showed it running more
        self._full_fleet: int | None = None
        #: pod -> the count running at its last scrape, while requests waited there
        self._last_queue: dict[str, int] = {}
        #: pod -> the most requests its scrapes showed running at once
        self._ran: dict[str, int] = {}
        #: nominal seconds per token -> the queue price learned from that starting point
        self._prices: dict[float, QueuePrice] = {}
        #: per pod, its attempts by key in start order (active-request's horizon counts them)
        self._by_pod: dict[str, dict[str, Attempt]] = {}
        # No attempt started before this (a lower bound): expire() skips its walk until the
        # cutoff reaches it.
        self._earliest = math.inf

    # ---- the relay's side ---------------------------------------------------------------

    def acquire(
        self,
        key: str,
        pod: str,
        prompt: int = 0,
        output: int = 0,
        whole: int = 0,
        now: float | None = None,
        ctx: RequestContext | None = None,
    ) -> None:
        """Attempt `key` starts on `pod`, with `prompt` + `output` tokens to work through, of
        a prompt of `whole` tokens (`ctx`: the relay's context of it, whose stream teaches
        the pod's pace and which readers of `attempts_on` see)."""
        if key in self._attempts:
            return
        start = time.monotonic() if now is None else now
        attempt = Attempt(pod, start, prompt, output, whole, ctx)
        self._attempts[key] = attempt
        mine = self._by_pod.get(pod)
        if mine is None:
            mine = self._by_pod[pod] = {}
        mine[key] = attempt
        requests_ahead = self.requests.get(pod, 0)  # every replica's, when shared
        ahead_keys = list(mine)[:-1] if self._prices else ()  # this one came in last
        own = self.own_requests
        own[pod] = own.get(pod, 0) + 1
        self.sent[pod] = self.sent.get(pod, 0) + 1
        if self._prices:  # before this attempt counts: what was ahead of it
            ahead = float(self.prompts.get(pod, 0))
            for price in self._prices.values():
                there = (
                    ahead if price.elsewhere is None else ahead + price.elsewhere().get(pod, 0.0)
                )
                predicted = price.predicted(pod, ahead_keys, start)
                price.sent(key, pod, there, prompt, start, requests_ahead, predicted)
        if prompt or output:
            self.own_tokens[pod] = self.own_tokens.get(pod, 0) + prompt + output
        if whole:
            self.own_prompts[pod] = self.own_prompts.get(pod, 0) + whole
        if self._split:
            _put(self.requests, pod, 1)
            _put(self.tokens, pod, prompt + output)
            _put(self.prompts, pod, whole)
        if self.poke is not None:
            self.poke()
        for listener in self._senders:
            listener(pod)
        if start < self._earliest:
            self._earliest = start
        elif self.timeout > 0 and start - self.timeout >= self._earliest:
            self.expire(start)  # one comparison per attempt until something is that old

    def on_send(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(pod)` whenever work is sent to `pod`: an attempt of this gateway
        starts there (`acquire`), or, shared, the other replicas' count of requests on it
        rises (`share_others`). Any number of listeners, each told in the order they came;
        one must be cheap and must not raise (it runs inside `acquire`). Returns the call
        that removes it. The data layer wakes its scrape loop this way (a pod quiet until
        now is scraped at once, not on a timer that ticks in case one is sent to)."""
        self._senders = (*self._senders, listener)

        def remove() -> None:
            self._senders = tuple(f for f in self._senders if f is not listener)

        return remove

    def keys_on(self, pod: str) -> Iterable[str]:
        """This gateway's attempts in flight on `pod`, oldest first (what the queue price's
        replay of the pod reads): a live view, read before the next attempt starts or ends."""
        return self._by_pod.get(pod, {}).keys()

    def prompt_done(self, key: str, now: float | None = None) -> None:
        """A stream's first chunk (arrived at `now`): the pod has prefilled the prompt; its
        tokens leave (and the queue prices learn how long the attempt waited)."""
        if self._prices:
            if now is None:
                now = time.monotonic()
            for price in self._prices.values():
                price.first_token(key, now)
        attempt = self._attempts.get(key)
        if attempt is None:
            return
        pod = attempt.pod
        if attempt.prompt:  # counted before its own window opens: its tokens are not in it
            self._prefilled[pod] = self._prefilled.get(pod, 0) + attempt.prompt
            self._take_tokens(pod, attempt.prompt)
            attempt.prompt = 0
            if self.poke is not None:
                self.poke()
        ctx = attempt.ctx
        if ctx is not None and not attempt.peers_at_first:
            attempt.peers_at_first = self._streaming_on(pod)
            attempt.prefilled_at_first = self._prefilled.get(pod, 0)
            # it runs: its model (an adapter) is loaded on the pod now
            recent = self._recent.get(pod)
            if recent is None:
                recent = self._recent[pod] = {}
            model = ctx.request.model
            recent.pop(model, None)
            recent[model] = None
            if len(recent) > RECENT_MODELS:
                del recent[next(iter(recent))]

    def release(self, key: str) -> None:
        """Attempt `key` is over (completed, failed, retried elsewhere or cancelled); a stream
        that ran to its end teaches its pod's pace."""
        attempt = self._attempts.pop(key, None)
        if attempt is None:
            return
        self._drop(key, attempt)
        ctx = attempt.ctx
        if ctx is not None and ctx.events_seen and ctx.error is None:
            pod = attempt.pod
            first, n = ctx.first_chunk_at, ctx.events_seen
            tpot = running = per_token = context = None
            if n > 1:
                tpot = (ctx.last_chunk_at - first) / (n - 1)
                peers = attempt.peers_at_first or 1
                running = (peers + self._streaming_on(pod) + 1) / 2
                prefilled = self._prefilled.get(pod, 0) - attempt.prefilled_at_first
                per_token = prefilled / (n - 1)
                context = attempt.whole + n / 2
            pace = self._paces.get(pod)
            if pace is None:
                pace = self._paces[pod] = Pace()
            pace.observe(first - attempt.start, tpot, running, per_token, context)

    # ---- upkeep -------------------------------------------------------------------------

    def expire(self, now: float | None = None) -> None:
        """Drop attempts older than `timeout`, whose end was never reported."""
        if self.timeout <= 0:
            return
        cutoff = (time.monotonic() if now is None else now) - self.timeout
        if cutoff < self._earliest:
            return
        attempts = self._attempts
        while attempts:  # insertion order is start order
            key, attempt = next(iter(attempts.items()))
            if attempt.start > cutoff:
                break
            del attempts[key]
            self._drop(key, attempt)
        self._earliest = next(iter(attempts.values())).start if attempts else math.inf

    def forget(self, pods: frozenset[str] | set[str]) -> None:
        """Pods that left the pool: what was counted on them goes (a pod back under the same
        name is a fresh server)."""
        for pod in pods:
            for key in self._by_pod.pop(pod, {}):
                self._attempts.pop(key, None)
            for counts in (self.own_requests, self.own_tokens, self.own_prompts,
                           self.requests, self.tokens, self.prompts):  # fmt: skip
                counts.pop(pod, None)
            for others in self._others.values():
                others.pop(pod, None)
        for measure in self._measures.values():
            measure.forget(pods)
        for price in self._prices.values():
            price.forget_pods(pods)
        for pod in pods:
            self._paces.pop(pod, None)
            self._prefilled.pop(pod, None)
            self._recent.pop(pod, None)
            self._full.pop(pod, None)
            self._last_queue.pop(pod, None)
            self._ran.pop(pod, None)

    def measure(self, name: str) -> Measure:
        """The per-attempt value kept under `name` (made on first use; the same object for
        every plugin instance that asks, across reloads)."""
        found = self._measures.get(name)
        if found is None:
            found = self._measures[name] = Measure(self)
            found._others = self._others.get("m:" + name, {})
        return found

    def scraped(self, pod: str, metrics: Metrics) -> None:
        """A scrape of `pod`'s engine (the data layer's). Requests waiting beside the same
        count running in two scrapes in a row say the pod is full at that count: its slots
        (`max_num_seqs`, or what its KV cache holds), which the queue prices read before their
        first tokens have taught them, and which corrects a free depth learned too deep while
        the pod had never been seen to queue. One scrape is not enough: vLLM holds a request
        as waiting until its next step even on a pod with room. Nor is a wait for a LoRA
        adapter slot (an adapter waiting that none running has): that request waits for the
        adapter, not for a sequence slot."""
        waiting, running = metrics.waiting, metrics.running
        if running > self._ran.get(pod, 0):
            self._ran[pod] = running
        if (
            waiting <= 0
            or running <= 0
            or any(a not in metrics.lora_running for a in metrics.lora_waiting)
        ):
            self._last_queue.pop(pod, None)
            return
        if self._last_queue.get(pod) == running:
            self._full[pod] = self._full_fleet = running
        self._last_queue[pod] = running

    def slots_seen(self, pod: str) -> int | None:
        """How many requests `pod` was seen to run at once while others waited (`scraped`);
        for a pod not seen full yet, the count last seen full on another pod, unless its own
        scrapes showed it running more; None before any."""
        own = self._full.get(pod)
        if own is not None:
            return own
        fleet = self._full_fleet
        if fleet is None or self._ran.get(pod, 0) > fleet:
            return None
        return fleet

    def queue_price(self, seconds_per_token: float) -> QueuePrice:
        """The per-pod queue price learned from this ledger's streamed attempts, starting from
        (and pricing a request's own prefill at) `seconds_per_token`; made on first use, then
        fed from every attempt, and the same object for every reader that asks with that
        rate, across reloads. Its readers need the uncached prompt of each attempt, so the
        relay counts tokens from then on."""
        found = self._prices.get(seconds_per_token)
        if found is None:
            found = self._prices[seconds_per_token] = QueuePrice(seconds_per_token, self.slots_seen)
            self.count_tokens = True
        return found

    def queue_prices(self) -> list[QueuePrice]:
        """Every queue price this ledger feeds."""
        return list(self._prices.values())

    # ---- replica sharing ----------------------------------------------------------------

    def published(self) -> dict[str, float]:
        """What this replica publishes to the others: its own per-pod totals of each series,
        as `<series>\x1f<pod>` -> value (requests "r", tokens "t", whole prompts "p", and
        each Measure as "m:<name>")."""
        out: dict[str, float] = {}
        for series, counts in (("r", self.own_requests), ("t", self.own_tokens),
                               ("p", self.own_prompts)):  # fmt: skip
            for pod, n in counts.items():
                if n:
                    out[f"{series}{SEP}{pod}"] = float(n)
        for name, measure in self._measures.items():
            for pod, value in measure.totals().items():
                out[f"m:{name}{SEP}{pod}"] = value
        return out

    def share_others(self, flat: Mapping[str, float]) -> None:
        """The other live replicas' sums (`published`'s shape, summed): from now on every
        reader's counts include them. Empty: this replica counts alone again."""
        others: dict[str, dict[str, float]] = {}
        for key, value in flat.items():
            series, sep, pod = key.partition(SEP)
            if sep and value > 0:
                others.setdefault(series, {})[pod] = value
        before, self._others = self._others.get("r") or {}, others
        if others or self._split:
            self._split = bool(others)
            self._sum_others(others)
        if self._senders:  # once the sums include the rise
            self._tell_rises(before, others.get("r") or {})

    def _sum_others(self, others: dict[str, dict[str, float]]) -> None:
        """Every reader's counts from this replica's and `others`'."""
        if others:
            self.requests = _sum(self.own_requests, others.get("r"))
            self.tokens = _sum(self.own_tokens, others.get("t"))
            self.prompts = _sum(self.own_prompts, others.get("p"))
        else:  # the sums are this replica's counts again, the very dicts it writes
            self.requests, self.tokens = self.own_requests, self.own_tokens
            self.prompts = self.own_prompts
        for name, measure in self._measures.items():
            measure._others = others.get("m:" + name, {})

    # ---- readers ------------------------------------------------------------------------

    def busy_pods(self) -> set[str]:
        """The pods with requests in flight, through this replica or (shared) another: every
        other pod has none, so a reader visits these instead of the whole pool."""
        busy = set(self._by_pod)
        if "r" in self._others:
            busy.update(pod for pod, n in self._others["r"].items() if round(n))
        return busy

    def requests_since(self, pod: str, cutoff: float) -> int:
        """Requests in flight on `pod` that started after `cutoff` (monotonic seconds): this
        replica's by their start, plus (shared) the other replicas' in flight there, whose
        starts are not published (their own ledgers expire them)."""
        mine = self._by_pod.get(pod)
        others = round(self._others["r"].get(pod, 0.0)) if "r" in self._others else 0
        if not mine:
            return others
        old = 0
        for attempt in mine.values():  # start order: the old ones come first
            if attempt.start > cutoff:
                break
            old += 1
        return len(mine) - old + others

    def attempts_on(self, pod: str) -> Iterable[Attempt]:
        """This gateway's attempts in flight on `pod`, oldest first: a live view, read before
        the next attempt starts or ends."""
        return self._by_pod.get(pod, {}).values()

    def pace(self, pod: str) -> Pace | None:
        """`pod`'s pace, None before a stream there ran to its end (a pod that left forgets
        it: back under the same name, it is a fresh server)."""
        return self._paces.get(pod)

    def paces(self) -> Mapping[str, Pace]:
        """pod -> its pace, for the pods that have one (a live view)."""
        return self._paces

    def busy_own_pods(self) -> KeysView[str]:
        """The pods with attempts of this gateway in flight (`attempts_on` lists them; a live
        view)."""
        return self._by_pod.keys()

    def recent_models(self, pod: str) -> Iterable[str]:
        """The models of the last attempts that began to answer on `pod` (their first chunk
        came), least recent first, each once."""
        return self._recent.get(pod, {}).keys()

    def _streaming_on(self, pod: str) -> int:
        """This gateway's attempts on `pod` whose stream has begun."""
        return sum(
            1 for a in self._by_pod.get(pod, {}).values() if a.ctx is not None and a.ctx.events_seen
        )

    def fleet_tpot(self) -> float | None:
        """The mean time per output token over the pods with one (what a pod with none yet is
        taken to run at), None while no pod has one."""
        known = [p.tpot for p in self._paces.values() if p.tpot is not None]
        return sum(known) / len(known) if known else None

    def attempts(self) -> int:
        """Attempts in flight, over every pod."""
        return len(self._attempts)

    # ---- internals ----------------------------------------------------------------------

    def _drop(self, key: str, attempt: Attempt) -> None:
        for measure in self._measures.values():
            measure.drop(key)
        for price in self._prices.values():
            price.forget(key)
        pod = attempt.pod
        mine = self._by_pod.get(pod)
        if mine is not None:
            mine.pop(key, None)
            if not mine:
                del self._by_pod[pod]
        _take(self.own_requests, pod, 1)
        held = attempt.prompt + attempt.output
        if held:
            _take(self.own_tokens, pod, held)
        if attempt.whole:
            _take(self.own_prompts, pod, attempt.whole)
        if self._split:
            _take(self.requests, pod, 1)
            _take(self.tokens, pod, held)
            _take(self.prompts, pod, attempt.whole)
        if self.poke is not None:
            self.poke()

    def _tell_rises(self, before: Mapping[str, float], after: Mapping[str, float]) -> None:
        """Tell the send listeners of the pods where the other replicas now have more
        requests than before (one of them sent work there)."""
        for pod, n in after.items():
            if round(n) > round(before.get(pod, 0.0)):
                for listener in self._senders:
                    listener(pod)

    def _take_tokens(self, pod: str, n: int) -> None:
        _take(self.own_tokens, pod, n)
        if self._split:
            _take(self.tokens, pod, n)


#: Between a series' name and a pod's in a published key (no pod name holds it).
SEP = "\x1f"


def _take(totals: dict[str, int], pod: str, n: int) -> None:
    if not n:
        return
    left = totals.get(pod, 0) - n
    if left > 0:
        totals[pod] = left
    else:
        totals.pop(pod, None)


def _put(totals: dict[str, int], pod: str, n: int) -> None:
    if n:
        totals[pod] = totals.get(pod, 0) + n


def _sum(own: Mapping[str, int], others: Mapping[str, float] | None) -> dict[str, int]:
    """This replica's counts plus the others' (rounded: they were published as floats)."""
    out = dict(own)
    for pod, value in (others or {}).items():
        n = round(value)
        if n > 0:
            out[pod] = out.get(pod, 0) + n
    return out


def warn_other_expiry(plugin: str, param: str, value: float, load: InFlightLoad) -> None:
    """A plugin's own request timeout, from before the ledger was one: the ledger's expiry
    applies instead, and a value other than it is warned about rather than silently lost."""
    if value != load.timeout:
        log.warning(
            "%s: %s %.0fs is not used: requests in flight expire after the gateway ledger's %.0fs",
            plugin,
            param,
            value,
            load.timeout,
        )


#: Output-to-input ratio of the output estimate (llm-d's inflight-load-producer default).
DEFAULT_OUTPUT_RATIO = 1.5
_OUTPUT_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


class LoadEstimate:
    """What one attempt adds to its pod's tokens: the prompt tokens the pod must compute
    (those the prefix match `match` finds says it holds are not counted; the
    whole prompt when none ran) and, with `add_output`, an output estimate: the prompt's
    length times `output_ratio`, at most the request's own cap (max_tokens, ...) and
    `max_output`."""

    __slots__ = ("add_output", "match", "max_output", "output_ratio")

    def __init__(
        self,
        match: MatchReader = DEFAULT_MATCH,
        add_output: bool = False,
        output_ratio: float = DEFAULT_OUTPUT_RATIO,
        max_output: int | None = None,
    ) -> None:
        self.match = match
        self.add_output = add_output
        self.output_ratio = output_ratio
        self.max_output = max_output

    def __call__(self, ctx: RequestContext) -> tuple[int, int, int]:
        """(uncached prompt tokens, output tokens, whole prompt tokens) of attempt `ctx` on
        its target. The whole prompt is the prefix match's count when one ran (the one its
        readers scored with), else the request's estimate."""
        request = ctx.request
        tokens = request.estimated_tokens()
        info = self.match(ctx.state)
        prompt = tokens if info is None else info.uncached_tokens(ctx.target.name)
        whole = info.prompt_tokens if info is not None and info.prompt_tokens else tokens
        if not self.add_output:
            return prompt, 0, whole
        output = round(tokens * self.output_ratio)  # from the whole prompt, cached or not
        data = request.data
        for name in _OUTPUT_CAPS:
            cap = data.get(name)
            if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                output = min(output, cap)
                break
        if self.max_output is not None:
            output = min(output, self.max_output)
        return prompt, output, whole


@runtime_checkable
class LoadEstimator(Protocol):
    """A plugin that says what an attempt adds to the ledger (inflight-load-producer); the
    gateway asks it once per attempt. Without one, `LoadEstimate()`'s defaults apply."""

    def estimate_load(self, ctx: RequestContext) -> tuple[int, int, int]:
        """(uncached prompt, output, whole prompt) tokens attempt `ctx` adds to its target's
        load."""
        ...
