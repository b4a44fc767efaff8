"""The learned per-pod queue cost: how long a request sent to a pod now would wait for what is in
flight there, learned from the streamed attempts this gateway sends (and, when shared, from
every replica's): seconds of first-token delay per prompt token in flight beyond the pod's
free depth (queue_delay.py), or, on a pod seen to queue behind its slots, a replay of those
slots from the ages of the attempts in flight and the pod's learned service time
(service_time.py).

It is learned from the in-flight ledger's own data (the prompt tokens in flight on the pod
when an attempt started, the attempt's uncached prompt, the time to its stream's first
chunk), so the ledger owns it and feeds it once per attempt from the request path: `sent` as
the attempt is acquired, `first_token` at the stream's first chunk (`prompt_done`), `forget`
as the attempt ends, expires or its pod leaves. A price therefore outlives config reloads
with the ledger, and forgetting a pod that left the pool happens once, in the ledger. Any
plugin reads it (`InFlightLoad.queue_price(seconds_per_token).wait(pod, ...)`, or `.price(pod)`
for the price alone): the affinity filter prices each candidate's queue with it. The ends of
attempts teach the service time (`forget` after a first chunk).

queue_delay.py holds the arithmetic (decayed sums per pod). Replica sharing: each replica
learning from its own half of the first tokens alone priced the same pod up to 15% apart from
the other and from a single gateway, enough to flip a keep or release decision now and then
(bench/RESULTS.md, "decision trace"), so with a journal (`share`) the samples ride on the
sync hub's ticks that run anyway, and the other replicas' are applied (`learned`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from heimdall_proxy.framework.queue_delay import DEPTHS, Fitted, QueueDelay, counted_share
from heimdall_proxy.framework.service_time import ServiceTime, residual_wait

__all__ = ["QueuePrice", "SampleJournal"]

#: A request ahead that delays the next first token by less than this share of a service time
#: on average does not hold it up (it runs beside it): what sets a pod's free depth. A full
#: two-slot pod delays by about a third of a service time (the expected rest of the sooner of
#: two replies), a free slot by a prefill's interleaving: 0.15 sits between with room for
#: noise (0.1 flipped depths back and forth on the shared-prefix trace).
FREE_SHARE = 0.15


class SampleJournal(Protocol):
    """Where the samples go to the other replicas (replicas/journal.py `Journal`)."""

    def append(self, record: list[Any], *, poke: bool = True) -> None: ...


class QueuePrice:
    """Per-pod cost of the work in flight, learned from first tokens: a price per prompt
    token beyond the pod's free depth, and where it explains the first tokens better, the
    wait a replay of the pod foresees from its requests' ages and its service time.

    `seconds_per_token` is the price before anything is learned (the pods' nominal prefill
    rate) and what a request's own uncached prompt is taken to cost (subtracted from its
    time to first token: the rest is the wait for what was ahead of it)."""

    __slots__ = (
        "_full",
        "_peak",
        "_running",
        "_seconds_per_token",
        "_serving",
        "_waiting",
        "delay",
        "elsewhere",
        "journal",
        "last",
        "service",
    )

    def __init__(
        self, seconds_per_token: float, full: Callable[[str], int | None] | None = None
    ) -> None:
        self._seconds_per_token = seconds_per_token
        #: pod -> the requests its engine was seen to run at once while others waited (the
        #: ledger's, from the pods' scrapes: InFlightLoad.slots_seen), None when unknown
        self._full: Callable[[str], int | None] = _unknown if full is None else full
        self.delay = QueueDelay()
        #: How long each pod holds a request (first chunk to end, plus its prefill).
        self.service = ServiceTime()
        #: attempt key -> (pod, prompt tokens ahead, requests ahead, the replay's predicted
        #: wait or None, own prefill seconds, sent at), for the attempts whose first chunk has
        #: not been seen yet
        self._waiting: dict[str, tuple[str, float, int, float | None, float, float]] = {}
        #: attempt key -> (pod, when its prefill started), for the attempts streaming
        self._serving: dict[str, tuple[str, float]] = {}
        #: pod -> attempts streaming there now, and the most seen streaming there at once
        self._running: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        #: The journal the samples are shared through (None: not shared); set by `share`.
        self.journal: SampleJournal | None = None
        #: The prompt tokens the other gateway replicas have in flight, per pod, when the
        #: ledger's counts are shared (they were ahead of an attempt too); set by `share`.
        self.elsewhere: Callable[[], Mapping[str, float]] | None = None
        #: The last sample taken: (attempt key, pod, tokens ahead, delay seconds), for the
        #: affinity filter's trace.
        self.last: tuple[str, str, float, float] | None = None

    # ---- read API ------------------------------------------------------------------------

    def price(self, pod: str) -> float:
        """Seconds of first-token delay per prompt token in flight on `pod`: learned there,
        else the fleet's, else the nominal prefill rate."""
        learned = self.fitted(pod)
        return self._seconds_per_token if learned is None else learned.price

    #: The same, under the name the affinity filter's estimate uses.
    seconds_per_token = price

    def wait(
        self,
        pod: str,
        ahead_tokens: float,
        requests_ahead: int,
        keys: Iterable[str] = (),
        now: float | None = None,
    ) -> float:
        """Seconds a request sent to `pod` now would wait for the `requests_ahead` requests
        (of `ahead_tokens` prompt tokens; this gateway's are attempts `keys`, oldest first)
        in flight there: the replayed wait where it explains the pod's first tokens best,
        else the tokens beyond the pod's learned free depth at its learned price
        (queue_delay.py); all of them at the nominal prefill rate while nothing is learned."""
        service = self.service.of(pod)
        fitted = self._fitted(pod, service)
        if fitted is None:
            return ahead_tokens * self._seconds_per_token
        if fitted.replay and service is not None and requests_ahead > fitted.depth:
            return self._replay(
                keys, fitted.depth, service, time.monotonic() if now is None else now
            )
        return ahead_tokens * counted_share(requests_ahead, fitted.depth) * fitted.price

    def predicted(self, pod: str, keys: Iterable[str], now: float) -> float | None:
        """The wait a replay of `pod` foresees for a request sent now behind attempts `keys`
        (oldest first), None while the pod's service time is not learned."""
        service = self.service.of(pod)
        if service is None:
            return None
        fitted = self._fitted(pod, service)
        return self._replay(keys, fitted.depth if fitted else 0, service, now)

    def _replay(self, keys: Iterable[str], depth: int, service: float, now: float) -> float:
        """The replay itself: attempts `keys` that are streaming hold a slot for what is left
        of `service`, those still waiting for their first chunk take the free slots in order
        or queue (service_time.py)."""
        remaining: list[float] = []
        queued = 0
        serving = self._serving
        for key in keys:
            entry = serving.get(key)
            if entry is None:
                queued += 1
            else:
                remaining.append(max(0.0, service - (now - entry[1])))
        return residual_wait(remaining, queued, depth, service)

    def slots(self, pod: str) -> int | None:
        """How many requests `pod` runs at once, once it was seen to queue (None before: as
        many as it is sent, as far as is known): what its engine ran while others waited
        (the ledger's scrapes), else one more than its learned free depth; never fewer than
        this gateway's attempts seen streaming there at the same time. The
        depth alone can read low: on LoRA traffic a request that waits for an adapter slot
        looks like one that waits behind the only request ahead, and a two-slot pod was
        taken for a one-slot pod in a fifth of the decisions on the mixed shape
        (bench/RESULTS.md, "Finish time")."""
        seen = self._full(pod)
        if seen is not None:
            return max(seen, self._peak.get(pod, 0))
        fitted = self.fitted(pod)
        if fitted is None or not fitted.bounded:
            return None
        return max(fitted.depth + 1, self._peak.get(pod, 0))

    def fitted(self, pod: str) -> Fitted | None:
        """What is learned of `pod`'s queue (queue_delay.py): a count of requests ahead whose
        first tokens waited less than FREE_SHARE of the pod's service time on average is
        within its free depth."""
        return self._fitted(pod, self.service.of(pod))

    def _fitted(self, pod: str, service: float | None) -> Fitted | None:
        # A pod's engine seen with requests waiting beside `slots` running has that many
        # slots, whatever the first tokens have taught (too few yet, or a depth they never saw
        # filled); before any first token, its wait is its slots' replay at the nominal price.
        # (A pod with more slots than the fit counts, DEPTHS, is left to the first tokens.)
        slots = self._full(pod)
        depth = None if slots is None or slots > DEPTHS else slots - 1
        fitted = self.delay.fit(pod, None if service is None else FREE_SHARE * service, depth)
        if fitted is None and depth is not None:
            return Fitted(depth, self._seconds_per_token, True, True)
        return fitted

    @property
    def nominal(self) -> float:
        """Seconds per token before anything is learned."""
        return self._seconds_per_token

    # ---- fed by the ledger -----------------------------------------------------------------

    def sent(
        self,
        key: str,
        pod: str,
        ahead: float,
        own_tokens: float,
        now: float,
        requests_ahead: int = 0,
        predicted: float | None = None,
    ) -> None:
        """Attempt `key` went to `pod` at `now` with `ahead` prompt tokens of
        `requests_ahead` requests in flight there (the replay foreseeing `predicted` seconds
        of wait) and `own_tokens` of its own prompt to prefill."""
        own = own_tokens * self._seconds_per_token
        self._waiting[key] = (pod, ahead, requests_ahead, predicted, own, now)

    @property
    def waiting(self) -> bool:
        """Some attempt's first chunk is still to come."""
        return bool(self._waiting)

    def first_token(self, key: str, now: float) -> tuple[str, float, float] | None:
        """The attempt's first chunk arrived at `now`: learn from it and return the sample
        (pod, tokens ahead, delay beyond its own prefill), or None for an attempt not sent."""
        entry = self._waiting.pop(key, None)
        if entry is None:
            return None
        pod, ahead, requests, predicted, own, sent = entry
        delay = now - sent - own
        self.delay.observe(pod, ahead, delay, requests, predicted)
        self._serving[key] = (pod, now - own)
        running = self._running[pod] = self._running.get(pod, 0) + 1
        if running > self._peak.get(pod, 0):
            self._peak[pod] = running
        self.last = (key, pod, ahead, delay)
        if self.journal is not None and ahead > 0.0:
            # rides on the next tick: the price moves slowly, no tick of its own needed
            self.journal.append([pod, ahead, delay, requests, predicted], poke=False)
        return pod, ahead, delay

    def forget(self, key: str) -> None:
        """The attempt ended (its first chunk seen or never to come): a streamed one teaches
        its pod's service time."""
        self._waiting.pop(key, None)
        serving = self._serving.pop(key, None)
        if serving is not None:
            pod, began = serving
            self.service.observe(pod, time.monotonic() - began)
            left = self._running.get(pod, 0) - 1
            if left > 0:
                self._running[pod] = left
            else:
                self._running.pop(pod, None)

    def forget_pods(self, pods: Iterable[str]) -> None:
        """Pods that left the pool: their samples and waiting attempts go (a pod back under the
        same name is a fresh server, and borrows the fleet's price until it has its own)."""
        gone = frozenset(pods)
        for pod in gone:
            self.delay.forget(pod)
            self.service.forget(pod)
            self._running.pop(pod, None)
            self._peak.pop(pod, None)
        for key in [k for k, entry in self._waiting.items() if entry[0] in gone]:
            del self._waiting[key]
        for key in [k for k, (pod, _) in self._serving.items() if pod in gone]:
            del self._serving[key]

    # ---- replica sharing -------------------------------------------------------------------

    def share(
        self,
        journal: SampleJournal | None,
        elsewhere: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        """Send the samples learned from now on through `journal`, and count the prompt
        tokens the other replicas have in flight (`elsewhere`) in what was ahead of an
        attempt (None, None: stop sharing)."""
        self.journal = journal
        self.elsewhere = elsewhere

    def learned(self, record: list[Any]) -> None:
        """Another replica's sample (pod, tokens ahead, delay seconds[, requests ahead,
        predicted wait]: an older replica's has neither)."""
        pod, ahead, delay = record[:3]
        requests = int(record[3]) if len(record) > 3 and record[3] is not None else None
        predicted = float(record[4]) if len(record) > 4 and record[4] is not None else None
        self.delay.observe(str(pod), float(ahead), float(delay), requests, predicted)


def _unknown(pod: str) -> None:
    """No pod's slots are known (a price made without a ledger)."""
    return None
