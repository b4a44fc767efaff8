"""The affinity filter's queue price: seconds of first-token delay per prompt token in flight
on a pod, learned from the streamed requests this gateway sends (and, when shared, from every
replica's).

queue_delay.py holds the arithmetic (decayed sums per pod). This module holds what feeds it:
the streamed attempts sent and not yet answered, the sample each first token gives, and the
journal that carries the samples to the other replicas. Each replica learning from its own
half of the first tokens alone priced the same pod up to 15% apart from the other and from a
single gateway, enough to flip a keep or release decision now and then (bench/RESULTS.md,
"decision trace"); the samples therefore ride on the sync hub's ticks that run anyway."""

from __future__ import annotations

import time
from typing import Any

from heimdall_proxy.plugins.filters.queue_delay import QueueDelay
from heimdall_proxy.replicas.journal import Journal


class QueuePrice:
    """Per-pod price of the prompt tokens in flight, learned from first tokens. Set
    `journal` (a journal whose records are applied with `learned`) to share the samples."""

    __slots__ = ("_seconds_per_token", "_waiting", "delay", "journal")

    def __init__(self, seconds_per_token: float) -> None:
        #: The price before anything is learned: the pod's nominal prefill rate.
        self._seconds_per_token = seconds_per_token
        self.delay = QueueDelay()
        #: attempt key -> (pod, prompt tokens ahead, own prefill seconds, sent at), for the
        #: streamed attempts whose first token has not been seen yet
        self._waiting: dict[str, tuple[str, float, float, float]] = {}
        self.journal: Journal | None = None

    def seconds_per_token(self, pod: str) -> float:
        """Seconds of delay per prompt token in flight on `pod`."""
        return self.delay.seconds_per_token(pod, self._seconds_per_token)

    def sent(self, key: str, pod: str, ahead: float, own_tokens: float) -> None:
        """A streamed attempt went to `pod` with `ahead` prompt tokens in flight there and
        `own_tokens` of its own prompt to prefill."""
        self._waiting[key] = (pod, ahead, own_tokens * self._seconds_per_token, time.monotonic())

    @property
    def waiting(self) -> bool:
        """Some attempt's first token is still to come (the stream hook's fast exit)."""
        return bool(self._waiting)

    def first_token(self, key: str) -> tuple[str, float, float] | None:
        """The attempt's first token arrived: learn from it and return the sample (pod,
        tokens ahead, delay beyond its own prefill), or None for an attempt not waited on."""
        entry = self._waiting.pop(key, None)
        if entry is None:
            return None
        pod, ahead, own, sent = entry
        delay = time.monotonic() - sent - own
        self.delay.observe(pod, ahead, delay)
        if self.journal is not None and ahead > 0.0:
            # rides on the next tick: the price moves slowly, no tick of its own needed
            self.journal.append([pod, ahead, delay], poke=False)
        return pod, ahead, delay

    def forget(self, key: str) -> None:
        """The attempt ended (its first token seen or never to come)."""
        self._waiting.pop(key, None)

    def learned(self, record: list[Any]) -> None:
        """Another replica's sample (pod, tokens ahead, delay seconds)."""
        pod, ahead, delay = record
        self.delay.observe(str(pod), float(ahead), float(delay))
