"""Passive outlier ejection: pods that keep failing leave the candidates for a while.

The relay reports every attempt's outcome; the director asks which candidates are ejected.
Semantics are Envoy's outlier detection, in the terms of `OutlierDetectionConfig`: after
`consecutive_failures` failures in a row a pod is ejected for `base_ejection_time` x the
number of its ejections (capped at `max_ejection_time`); when that time is over it is a
candidate again, and the next attempt decides (one failure re-ejects it, for longer; a
success resets its count of ejections). If every candidate is ejected, none is (panic mode):
better a pod that may fail than a certain 503.

Whose fault a failure is: a connect or read failure, or a 429, 502, 503 or 504, is the pod's
and counts at once. A 500 may be the request's (a body that crashes the model server's
handler fails on every pod), so it is held by the request's `Verdicts` until another pod
tells: a success there makes it the first pod's fault (counted); another 500, or a 4xx,
makes it the request's (counted against no pod, and the relay stops trying pods)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from heimdall_proxy.config.gateway import OutlierDetectionConfig
from heimdall_proxy.framework.types import Endpoint

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _PodState:
    failures: int = 0
    ejections: int = 0
    until: float = 0.0
    #: back after an ejection: the next failure alone ejects again
    on_trial: bool = False


class OutlierDetector:
    def __init__(
        self,
        config: OutlierDetectionConfig,
        on_eject: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._pods: dict[str, _PodState] = {}
        self._on_eject = on_eject
        self._clock = clock
        #: Whether a pod may be ejected now (`filter` keeps every candidate while not).
        self.any_ejected = False

    def success(self, pod: str) -> None:
        state = self._pods.get(pod)
        if state is not None:
            state.failures = 0
            if state.on_trial:
                state.on_trial = False
                state.ejections = 0

    def failure(self, pod: str) -> None:
        limit = self.config.consecutive_failures
        if limit <= 0:
            return
        state = self._pods.setdefault(pod, _PodState())
        state.failures += 1
        if state.on_trial or state.failures >= limit:
            state.ejections += 1
            hold = min(
                self.config.max_ejection_time, self.config.base_ejection_time * state.ejections
            )
            state.until = self._clock() + hold
            state.failures = 0
            state.on_trial = True
            self.any_ejected = True
            log.warning("pod %s ejected for %.0fs after failing", pod, hold)
            if self._on_eject is not None:
                self._on_eject(pod)

    def ejected(self, pod: str) -> bool:
        state = self._pods.get(pod)
        return state is not None and state.until > self._clock()

    def ejection(self, pod: str) -> tuple[float, int]:
        """Seconds left of `pod`'s ejection (0: in rotation) and how many times in a row it
        was ejected (the live page shows both)."""
        state = self._pods.get(pod)
        if state is None:
            return 0.0, 0
        return max(0.0, state.until - self._clock()), state.ejections

    def filter(self, candidates: list[Endpoint]) -> list[Endpoint]:
        """The candidates not ejected; all of them when every one is (panic mode)."""
        if not self.any_ejected:
            return candidates
        now = self._clock()
        pods = self._pods
        kept = [e for e in candidates if (s := pods.get(e.name)) is None or s.until <= now]
        if len(kept) == len(candidates):
            self.any_ejected = any(s.until > now for s in pods.values())
        return kept or candidates


#: Statuses that say the pod cannot serve now, whatever the request (overload, gone, slow).
POD_FAULT_STATUSES = frozenset({429, 502, 503, 504})
#: The one status that may be the request's fault rather than the pod's.
AMBIGUOUS_STATUS = 500


class Verdicts:
    """One request's attempts, as the outlier detector should count them: a 500 is held
    until another pod's answer says whose fault it was (see the module docstring)."""

    __slots__ = ("_detector", "_held")

    def __init__(self, detector: OutlierDetector) -> None:
        self._detector = detector
        self._held: str | None = None

    def answered(self, pod: str, status: int) -> bool:
        """Count `pod`'s answer `status`. True when the request itself is at fault (a second
        pod answered 500 too): it must not be tried on more pods."""
        detector = self._detector
        if status == AMBIGUOUS_STATUS:
            if self._held is not None:
                self._held = None  # two pods failed the same request: neither is to blame
                return True
            self._held = pod
            return False
        if status in POD_FAULT_STATUSES:
            detector.failure(pod)
            return False
        detector.success(pod)
        held, self._held = self._held, None
        if held is not None and status < 400:  # another pod served it: the 500 was the pod's
            detector.failure(held)
        return False
