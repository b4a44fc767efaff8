"""How long a pod holds a request once it runs it, and how long a new request would wait for
the ones in flight there to make room: the time half of the learned queue cost
(queue_delay.py weighs both halves against the first tokens seen).

Pricing the prompt tokens in flight says how busy a pod is on average; it cannot tell a pod
whose two running requests started a moment ago from one whose requests are about to finish,
and that is most of what a request sent there will wait on a pod that runs a fixed number at
once. The ledger knows when each attempt on a pod started, so with the pod's learned service
time (first chunk to end, plus the prefill before it, decayed over recent attempts) and its
learned free depth (how many run at once without delaying anybody), the wait follows from a
small replay of the pod: the oldest run, each remaining for what is left of a service time,
the rest queue behind them in order. Inference-perf's shared prefix on two-slot pods: the
price alone kept a group on a full pod while another had a slot free (p95 1.22x the
oracle's); with this wait, 1.02x (bench/RESULTS.md, real traces against the oracle)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass


def residual_wait(remaining: list[float], queued: int, depth: int, service: float) -> float:
    """Seconds until a request sent now would start on a pod that runs `depth` + 1 requests at
    once, each for `service` seconds, where the requests running have `remaining` seconds left
    (the list is reordered) and `queued` more wait their turn ahead of the new one."""
    slots = depth + 1
    if len(remaining) < slots:
        if not queued:
            return 0.0
        take = min(queued, slots - len(remaining))
        remaining.extend([service] * take)
        queued -= take
        if len(remaining) < slots:
            return 0.0
    if len(remaining) > slots:  # more run than the depth says: the extra ones queue
        remaining.sort()
        queued += len(remaining) - slots
        del remaining[slots:]
    heapq.heapify(remaining)
    for _ in range(queued):
        heapq.heapreplace(remaining, remaining[0] + service)
    return remaining[0]


@dataclass(slots=True)
class _Mean:
    total: float = 0.0
    weight: float = 0.0
    samples: int = 0


class ServiceTime:
    """Decayed mean seconds a pod holds a request from the start of its prefill to its end,
    per pod (the fleet's while a pod has fewer than `min_samples`, from the fleet's first
    sample: until then a full pod's wait has no replay, and its price, learned from a few
    first tokens, read three requests queued on two slots as 0.14 s of wait where they
    waited 0.6-1.2 s; bench/RESULTS.md, "The replay on pods seen full")."""

    __slots__ = ("_fleet", "_keep", "_min", "_pods")

    def __init__(self, half_life: float = 32.0, min_samples: int = 4) -> None:
        self._keep = 0.5 ** (1.0 / half_life)
        self._min = min_samples
        self._pods: dict[str, _Mean] = {}
        self._fleet = _Mean()

    def observe(self, pod: str, seconds: float) -> None:
        """An attempt on `pod` ran `seconds` from its prefill's start to its end."""
        seconds = max(0.0, seconds)
        mean = self._pods.get(pod)
        if mean is None:
            mean = self._pods[pod] = _Mean()
        for m in (mean, self._fleet):
            m.total = m.total * self._keep + seconds
            m.weight = m.weight * self._keep + 1.0
            m.samples += 1

    def of(self, pod: str) -> float | None:
        """`pod`'s learned service seconds (the fleet's while it has too few), None before
        any attempt has ended."""
        mean = self._pods.get(pod)
        if mean is None or mean.samples < self._min:
            mean = self._fleet
            if not mean.samples:
                return None
        return mean.total / mean.weight

    def forget(self, pod: str) -> None:
        self._pods.pop(pod, None)
