"""How long one prompt token in flight on a pod really delays the next request's first token,
learned from the first tokens this gateway sees.

The affinity filter weighs a pod's queue by the prompt tokens it has in flight. Converting
that to time at the pod's prefill rate is right only where the wait is for prefill (a large
batch that admits every request at once). Where requests wait for a decode slot, each one
ahead costs its whole reply, several times its prefill, and a filter that prices the queue at
prefill speed holds a busy warm pod far too long. Measuring per pod how the time to first
token (less the request's own prefill) grows with the prompt tokens that were ahead of it
gives the right price on either kind of pod, and on pods of unequal speed, with no knob to
calibrate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Sums:
    """Exponentially decayed sums for a least-squares line of delay seconds (y) against
    prompt tokens ahead (x), and how many samples."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    samples: int = 0

    def add(self, x: float, y: float, keep: float) -> None:
        self.w = self.w * keep + 1.0
        self.x = self.x * keep + x
        self.y = self.y * keep + y
        self.xx = self.xx * keep + x * x
        self.xy = self.xy * keep + x * y
        self.samples += 1

    def line(self) -> tuple[float, float]:
        """(intercept, slope). Where the samples cannot place a line (all at one queue
        length) or place a falling one (noise), the line through the origin and their mean:
        the ratio of the sums."""
        spread = self.w * self.xx - self.x * self.x
        if spread > 1e-9 * self.w * self.xx:
            slope = (self.w * self.xy - self.x * self.y) / spread
            if slope > 0.0:
                return (self.y - slope * self.x) / self.w, slope
        return 0.0, (self.y / self.x if self.x > 0.0 else 0.0)


class QueueDelay:
    """First-token delay as a line in the prompt tokens in flight, per pod, fitted by least
    squares over decayed sums (recent samples weighing most). A line, not a ratio: a pod
    with a free slot starts a request at once however much it has in flight, so delay grows
    only beyond some queue length, and a ratio through the origin averages that flat stretch
    in and prices each further request ahead at about half its real cost. What the filter
    compares is that marginal cost, between pods. A pod with fewer than `min_samples` samples
    borrows the fleet's line; with neither, the caller's default price (its prefill rate)
    stands."""

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
        self._pods.setdefault(pod, _Sums()).add(ahead_tokens, delay, self._keep)
        self._fleet.add(ahead_tokens, delay, self._keep)

    def _sums(self, pod: str) -> _Sums | None:
        sums = self._pods.get(pod)
        if sums is None or sums.samples < self._min:
            sums = self._fleet
            if sums.samples < self._min:
                return None
        return sums

    def seconds_per_token(self, pod: str, default: float) -> float:
        """The marginal price: seconds of delay one more prompt token in flight adds."""
        sums = self._sums(pod)
        return default if sums is None else sums.line()[1]

    def delay(self, pod: str, ahead_tokens: float, default: float) -> float:
        """Seconds a request would wait on `pod` behind `ahead_tokens` prompt tokens in
        flight (`default` seconds per token until learned)."""
        sums = self._sums(pod)
        if sums is None:
            return ahead_tokens * default
        intercept, slope = sums.line()
        return max(0.0, intercept + slope * ahead_tokens)
