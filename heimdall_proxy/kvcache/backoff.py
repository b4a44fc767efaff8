"""Backoff: the waits between attempts at something that keeps failing.

A publisher whose subscription fails (an address ZMQ refuses, no socket left in the context)
would otherwise be tried, and its failure logged, at a fixed pace for as long as it is
configured; doubling the wait after each failure, up to a cap, keeps a dead publisher from
costing more than an occasional attempt while one that comes back soon is found soon."""

from __future__ import annotations


class Backoff:
    """A run of failures: after the n-th, wait `base * 2**(n-1)` seconds, at most `cap`."""

    __slots__ = ("base", "cap", "failures")

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def failed(self) -> float:
        """Count one more failure; returns the wait before the next attempt."""
        self.failures += 1
        # the exponent is bounded, so a publisher failing for days cannot overflow it
        return min(self.cap, self.base * 2.0 ** min(self.failures - 1, 64))
