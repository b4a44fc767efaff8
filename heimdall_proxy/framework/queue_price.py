"""The learned per-pod queue price: seconds of first-token delay per prompt token in flight on a
pod, learned from the streamed attempts this gateway sends (and, when shared, from every
replica's).

It is learned from the in-flight ledger's own data (the prompt tokens in flight on the pod
when an attempt started, the attempt's uncached prompt, the time to its stream's first
chunk), so the ledger owns it and feeds it once per attempt from the request path: `sent` as
the attempt is acquired, `first_token` at the stream's first chunk (`prompt_done`), `forget`
as the attempt ends, expires or its pod leaves. A price therefore outlives config reloads
with the ledger, and forgetting a pod that left the pool happens once, in the ledger. Any
plugin reads it (`InFlightLoad.queue_price(seconds_per_token).price(pod)`): the affinity
filter prices each candidate's queue with it.

queue_delay.py holds the arithmetic (decayed sums per pod). Replica sharing: each replica
learning from its own half of the first tokens alone priced the same pod up to 15% apart from
the other and from a single gateway, enough to flip a keep or release decision now and then
(bench/RESULTS.md, "decision trace"), so with a journal (`share`) the samples ride on the
sync hub's ticks that run anyway, and the other replicas' are applied (`learned`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from heimdall_proxy.framework.queue_delay import QueueDelay

__all__ = ["QueuePrice", "SampleJournal"]


class SampleJournal(Protocol):
    """Where the samples go to the other replicas (replicas/journal.py `Journal`)."""

    def append(self, record: list[Any], *, poke: bool = True) -> None: ...


class QueuePrice:
    """Per-pod price of the prompt tokens in flight, learned from first tokens.

    `seconds_per_token` is the price before anything is learned (the pods' nominal prefill
    rate) and what a request's own uncached prompt is taken to cost (subtracted from its
    time to first token: the rest is the wait for what was ahead of it)."""

    __slots__ = ("_seconds_per_token", "_waiting", "delay", "elsewhere", "journal", "last")

    def __init__(self, seconds_per_token: float) -> None:
        self._seconds_per_token = seconds_per_token
        self.delay = QueueDelay()
        #: attempt key -> (pod, prompt tokens ahead, own prefill seconds, sent at), for the
        #: attempts whose first chunk has not been seen yet
        self._waiting: dict[str, tuple[str, float, float, float]] = {}
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
        return self.delay.seconds_per_token(pod, self._seconds_per_token)

    #: The same, under the name the affinity filter's estimate uses.
    seconds_per_token = price

    @property
    def nominal(self) -> float:
        """Seconds per token before anything is learned."""
        return self._seconds_per_token

    # ---- fed by the ledger -----------------------------------------------------------------

    def sent(self, key: str, pod: str, ahead: float, own_tokens: float, now: float) -> None:
        """Attempt `key` went to `pod` at `now` with `ahead` prompt tokens in flight there and
        `own_tokens` of its own prompt to prefill."""
        self._waiting[key] = (pod, ahead, own_tokens * self._seconds_per_token, now)

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
        pod, ahead, own, sent = entry
        delay = now - sent - own
        self.delay.observe(pod, ahead, delay)
        self.last = (key, pod, ahead, delay)
        if self.journal is not None and ahead > 0.0:
            # rides on the next tick: the price moves slowly, no tick of its own needed
            self.journal.append([pod, ahead, delay], poke=False)
        return pod, ahead, delay

    def forget(self, key: str) -> None:
        """The attempt ended (its first chunk seen or never to come)."""
        self._waiting.pop(key, None)

    def forget_pods(self, pods: Iterable[str]) -> None:
        """Pods that left the pool: their samples and waiting attempts go (a pod back under the
        same name is a fresh server, and borrows the fleet's price until it has its own)."""
        gone = frozenset(pods)
        for pod in gone:
            self.delay.forget(pod)
        for key in [k for k, entry in self._waiting.items() if entry[0] in gone]:
            del self._waiting[key]

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
        """Another replica's sample (pod, tokens ahead, delay seconds)."""
        pod, ahead, delay = record
        self.delay.observe(str(pod), float(ahead), float(delay))
