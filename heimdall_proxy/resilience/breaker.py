"""A circuit breaker for the dependencies on the request path (the KV index in Redis, the
tokenizer service): when one is slow or down, requests stop waiting on it at once and go on
without its signal, and it is tried again after a cool-down.

closed -> (`failures` in a row) -> open for `cooldown` seconds -> half-open: one call is let
through; success closes, failure opens again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


class CircuitBreaker:
    __slots__ = (
        "_clock",
        "_failures",
        "_open_until",
        "_probing",
        "cooldown",
        "failures",
        "name",
        "opened",
    )

    def __init__(
        self,
        name: str,
        failures: int = 3,
        cooldown: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.failures = max(1, failures)
        self.cooldown = cooldown
        self._clock = clock
        self._failures = 0
        self._open_until = 0.0
        self._probing = False
        #: Times it went from closed (or half-open) to open.
        self.opened = 0

    @property
    def state(self) -> str:
        if self._open_until == 0.0:
            return "closed"
        return "open" if self._clock() < self._open_until else "half-open"

    def allow(self) -> bool:
        """Whether to call the dependency now (half-open: one trial call at a time)."""
        if self._open_until == 0.0:
            return True
        if self._clock() < self._open_until or self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        if self._open_until:
            log.info("%s reachable again", self.name)
        self._failures = 0
        self._open_until = 0.0
        self._probing = False

    def failure(self) -> None:
        self._failures += 1
        self._probing = False
        if self._open_until or self._failures >= self.failures:
            if not self._open_until or self._clock() >= self._open_until:
                self.opened += 1
                log.warning(
                    "%s failing: requests go on without it for %.0fs", self.name, self.cooldown
                )
            self._open_until = self._clock() + self.cooldown


@runtime_checkable
class HasBreakers(Protocol):
    """A plugin that guards its dependencies with breakers (their states are exported)."""

    def breakers(self) -> Iterable[CircuitBreaker]: ...
