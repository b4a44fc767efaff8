"""Backoff: the waits between attempts at something that keeps failing.

A publisher whose subscription fails (an address ZMQ refuses, no socket left in the context)
would otherwise be tried, and its failure logged, at a fixed pace for as long as it is
configured; doubling the wait after each failure, up to a cap, keeps a dead publisher from
costing more than an occasional attempt while one that comes back soon is found soon. A
failure long after the run's last one (the attempt in between held) starts a new run, at the
base wait again."""

from __future__ import annotations


class Backoff:
    """A run of failures of one thing at one `target`: after the n-th, wait
    `base * 2**(n-1)` seconds, at most `cap`. `capped_now` is True after the failure whose
    wait first reached the cap (worth saying again: it will not get better by itself)."""

    __slots__ = ("base", "cap", "capped_now", "failures", "last_at", "last_wait", "target")

    def __init__(self, base: float, cap: float, target: str = "") -> None:
        self.base = base
        self.cap = cap
        self.target = target
        self.failures = 0
        self.capped_now = False
        self.last_at = 0.0
        self.last_wait = 0.0

    def failed(self, now: float) -> float:
        """Count one more failure at `now` (monotonic seconds); returns the wait before the
        next attempt. A failure more than max(2 x the last wait, cap) + base after the last
        attempt was due starts the run over: what failed then had recovered, even if
        nothing said so."""
        if self.failures and now - self.last_at > max(2 * self.last_wait, self.cap) + self.base:
            self.failures = 0
        self.failures += 1
        # the exponent is bounded, so a publisher failing for days cannot overflow it
        wait = min(self.cap, self.base * 2.0 ** min(self.failures - 1, 64))
        self.capped_now = wait >= self.cap and (self.failures == 1 or self.last_wait < self.cap)
        self.last_at = now + wait  # the next attempt's time: what "long after" counts from
        self.last_wait = wait
        return wait
