"""How long one prompt token in flight on a pod really delays the next request's first token,
learned from the first tokens this gateway sees.

The affinity filter weighs a pod's queue by the prompt tokens in flight there (the in-flight
ledger's `prompts`). Converting
that to time at the pod's prefill rate is right only where the wait is for prefill (a large
batch that admits every request at once). Where requests wait for a decode slot, each one
ahead costs its whole reply, several times its prefill, and a filter that prices the queue at
prefill speed holds a busy warm pod far too long. Measuring the ratio per pod (time to first
token, less the request's own prefill, over the prompt tokens that were ahead of it) gives the
right price on either kind of pod, and on pods of unequal speed, with no knob to calibrate.
This module is the arithmetic; queue_price.py feeds it from the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Sums:
    """Exponentially decayed sums of (delay seconds, tokens ahead), and how many samples."""

    delay: float = 0.0
    ahead: float = 0.0
    samples: int = 0

    def add(self, delay: float, ahead: float, keep: float) -> None:
        self.delay = self.delay * keep + delay
        self.ahead = self.ahead * keep + ahead
        self.samples += 1


class QueueDelay:
    """Seconds of first-token delay per prompt token in flight, per pod, as a ratio of decayed
    sums (a least-squares slope through the origin, recent samples weighing most). A pod with
    fewer than `min_samples` samples borrows the fleet's ratio; with neither, the
    caller's default (its prefill rate) stands."""

    __slots__ = ("_fleet", "_keep", "_min", "_pods")

    def __init__(self, half_life: float = 32.0, min_samples: int = 4) -> None:
        self._keep = 0.5 ** (1.0 / half_life)
        self._min = min_samples
        self._pods: dict[str, _Sums] = {}
        self._fleet = _Sums()

    def observe(self, pod: str, ahead_tokens: float, delay: float) -> None:
        """One first token: `delay` seconds beyond the request's own prefill, with
        `ahead_tokens` prompt tokens in flight on `pod` when it was sent. Requests that had
        nothing ahead say nothing about the queue and are not counted."""
        if ahead_tokens <= 0.0:
            return
        delay = max(0.0, delay)
        self._pods.setdefault(pod, _Sums()).add(delay, ahead_tokens, self._keep)
        self._fleet.add(delay, ahead_tokens, self._keep)

    def forget(self, pod: str) -> None:
        """Drop `pod`'s own samples (it borrows the fleet's ratio until it has new ones)."""
        self._pods.pop(pod, None)

    def seconds_per_token(self, pod: str, default: float) -> float:
        """`pod`'s learned seconds per prompt token ahead (the fleet's while it has too few
        samples of its own), or `default` while nothing is learned."""
        sums = self._pods.get(pod)
        if sums is None or sums.samples < self._min:
            sums = self._fleet
            if sums.samples < self._min:
                return default
        return sums.delay / sums.ahead if sums.ahead > 0.0 else default
