"""The background loop of a sync hub (one per process and store): one `tick()` (one round
trip) per interval, with Redis outages logged once when they begin and once when they end, so
a replica whose Redis is down keeps routing on its own state instead of failing requests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

log = logging.getLogger(__name__)


#: Shortest time between two ticks: pokes arriving meanwhile share the next tick, so a busy
#: replica makes at most 1 / MIN_GAP round trips per second per store, whatever the number
#: of plugins sharing state through it.
MIN_GAP = 0.005


class Ticker:
    """Runs `tick` every `interval` seconds until stopped, and sooner when poked (a local
    change worth publishing now), at most every MIN_GAP. `tick` raising a Redis or
    connection error marks the store unreachable (logged once) and is retried on the next
    tick; any other exception is a bug and is logged with its traceback, and the loop goes on."""

    __slots__ = ("_down", "_interval", "_stopped", "_task", "_tick", "_wake", "what")

    def __init__(self, what: str, interval: float, tick: Callable[[], Awaitable[object]]) -> None:
        self.what = what
        self._interval = interval
        self._tick = tick
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopped = False
        self._down = False

    @property
    def reachable(self) -> bool:
        return not self._down

    @property
    def interval(self) -> float:
        return self._interval

    @interval.setter
    def interval(self, seconds: float) -> None:
        """Takes effect from the next wait on."""
        self._interval = seconds

    def start(self) -> None:
        """Tick every interval from now on (the first tick one interval from now)."""
        if self._task is None:
            self._stopped = False
            self._task = asyncio.create_task(self._run(), name=f"replicas:{self.what}")

    async def stop(self) -> None:
        """Stop ticking. A tick in flight is let finish (bounded by the client's command
        timeout): cancelling a Redis command half-way leaves its connection unusable."""
        task, self._task = self._task, None
        if task is not None:
            self._stopped = True
            self._wake.set()
            try:
                await asyncio.wait_for(task, timeout=5.0)
            except TimeoutError:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def poke(self) -> None:
        """Tick as soon as MIN_GAP allows (no I/O here: the request path calls it)."""
        self._wake.set()

    async def once(self) -> None:
        """One tick now, with the loop's error handling (tests and shutdown use it)."""
        try:
            await self._tick()
        except (RedisError, OSError) as exc:
            if not self._down:
                log.warning("shared %s: Redis unreachable, routing on local state: %s",
                            self.what, exc)  # fmt: skip
            self._down = True
            return
        except Exception:
            log.exception("shared %s: sync failed", self.what)
            return
        if self._down:
            log.warning("shared %s: Redis reachable again", self.what)
            self._down = False

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            if self._stopped:
                return
            self._wake.clear()
            await self.once()
            await asyncio.sleep(MIN_GAP)
