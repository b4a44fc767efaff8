"""The recent picks the live page shows (`--live-page`, server/live.py): which pod each of the
last requests went to, and the whole scheduling trace of a few of them.

Only the director writes here, once per scheduled request and only when the live page is on.
A trace costs the scheduler a dict per scorer, so at most one request per `trace_every`
seconds records one; the rest record four fields into a bounded deque."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from heimdall_proxy.framework.trace import ScheduleTrace


@dataclass(slots=True)
class Pick:
    id: int
    #: wall-clock seconds
    at: float
    model: str
    profile: str
    pod: str
    #: the picked pod's share of the prompt already cached (None: no prefix producer ran)
    prefix: float | None
    trace: ScheduleTrace | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "model": self.model,
            "profile": self.profile,
            "pod": self.pod,
            "prefix": self.prefix,
            "traced": self.trace is not None,
        }


class PickLog:
    def __init__(self, size: int = 200, traces: int = 10, trace_every: float = 0.25) -> None:
        self.picks: deque[Pick] = deque(maxlen=size)
        self.traced: deque[Pick] = deque(maxlen=traces)
        self.trace_every = trace_every
        #: picks ever recorded (the id of the last one)
        self.count = 0
        self._last_trace = -float("inf")

    def want_trace(self) -> ScheduleTrace | None:
        """A trace for the request about to be scheduled, or None when one was taken less
        than `trace_every` seconds ago."""
        now = time.monotonic()
        if now - self._last_trace < self.trace_every:
            return None
        self._last_trace = now
        return ScheduleTrace()

    def record(
        self,
        model: str,
        profile: str,
        pod: str,
        prefix: float | None,
        trace: ScheduleTrace | None,
    ) -> None:
        self.count += 1
        pick = Pick(self.count, time.time(), model, profile, pod, prefix, trace)
        self.picks.append(pick)
        if trace is not None:
            self.traced.append(pick)

    def find(self, pick_id: int) -> Pick | None:
        """A recent pick that kept its trace."""
        for pick in self.traced:
            if pick.id == pick_id:
                return pick
        return None

    def recent(self, n: int = 30) -> list[dict[str, Any]]:
        """The last `n` picks, newest first."""
        out: list[dict[str, Any]] = []
        for pick in reversed(self.picks):
            if len(out) == n:
                break
            out.append(pick.to_json())
        return out

    def per_pod(self) -> dict[str, tuple[int, float | None]]:
        """Per pod, over the picks kept: how many went there, and the mean prefix hit rate
        of those where it is known (None when none is)."""
        counts: dict[str, int] = {}
        sums: dict[str, tuple[float, int]] = {}
        for pick in self.picks:
            counts[pick.pod] = counts.get(pick.pod, 0) + 1
            if pick.prefix is not None:
                total, n = sums.get(pick.pod, (0.0, 0))
                sums[pick.pod] = (total + pick.prefix, n + 1)
        return {
            pod: (n, sums[pod][0] / sums[pod][1] if pod in sums else None)
            for pod, n in counts.items()
        }
