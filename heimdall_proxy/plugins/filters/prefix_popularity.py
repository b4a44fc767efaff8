"""How many recent requests shared each prefix, for the affinity filter's release margin.

The affinity filter holds a request on the pods that have its prefix until the best of them
would answer more than a margin later than the best other pod. The margin pays for the cache
a move gives up, and what that is worth depends on the prefix. A conversation's history is
wanted by one request at a time: moving it buys this request a shorter wait and the next turn
follows it to the new pod, so holding it costs little and keeps its hits. A system prompt
that many requests share is wanted by all of them: a pod it moves to is warm for every later
one, and holding it on busy pods queues all of them. So the filter divides the margin by a
power of how many recent requests shared the prefix (see prefix_affinity.py); this module
keeps that count, decayed per request seen.
"""

from __future__ import annotations

import math

__all__ = ["PrefixPopularity"]


class PrefixPopularity:
    """Exponentially decayed request counts per prefix key, on a clock that ticks once per
    request seen: after n requests, a count has been multiplied by 0.5 ** (n / half_life).
    Keys whose count has decayed below `floor` are dropped every `half_life` requests, so
    memory is bounded by the keys of recent traffic."""

    __slots__ = ("_counts", "_floor", "_keep", "_seen", "_sweep_every")

    def __init__(self, half_life: float = 64.0, floor: float = 0.01) -> None:
        self._keep = math.pow(0.5, 1.0 / half_life)
        self._floor = floor
        self._sweep_every = max(1, int(half_life))
        # key -> (count as of request number `at`, at)
        self._counts: dict[int, tuple[float, int]] = {}
        self._seen = 0

    def __len__(self) -> int:
        return len(self._counts)

    def observe(self, key: int | None) -> float:
        """Count one request (sharing the prefix `key`, or none) and return the decayed
        number of recent requests that shared `key`, this one included (0.0 for None)."""
        self._seen += 1
        if self._seen % self._sweep_every == 0:
            self._sweep()
        if key is None:
            return 0.0
        count = self.count(key) + 1.0
        self._counts[key] = (count, self._seen)
        return count

    def count(self, key: int) -> float:
        """The decayed number of recent requests that shared `key`."""
        entry = self._counts.get(key)
        if entry is None:
            return 0.0
        count, at = entry
        return count * math.pow(self._keep, self._seen - at)

    def _sweep(self) -> None:
        floor = self._floor
        self._counts = {
            k: (c, at)
            for k, (c, at) in self._counts.items()
            if c * math.pow(self._keep, self._seen - at) >= floor
        }
