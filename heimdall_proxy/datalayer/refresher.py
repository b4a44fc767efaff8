"""Background refresh of every pod: /metrics on a short interval, /v1/models on a longer one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from ssl import SSLContext

import aiohttp
import orjson

from heimdall_proxy.datalayer.cadence import ScrapeCadence
from heimdall_proxy.datalayer.pages import PageReader
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.datalayer.rescan import PageScanner
from heimdall_proxy.datalayer.scan import Sample, scan_families
from heimdall_proxy.datalayer.vllm_metrics import ALL_FAMILIES, metrics_from_families
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.plugins import (
    ENDPOINT_EVENTS,
    MODEL_LIST_DATA,
    DataExtractor,
    DataSource,
    EndpointExtractor,
)
from heimdall_proxy.framework.types import Endpoint, parse_model_list, publish_models

log = logging.getLogger(__name__)

#: How much sooner than planned a timer may fire (uvloop's count whole milliseconds): a pass
#: treats what is due within it as due, rather than waking again for it.
TIMER_EARLY = 0.002

#: Consecutive failed scrapes after which a pod is taken out of rotation.
UNHEALTHY_AFTER = 3


@dataclass(slots=True)
class WiredSource:
    """One `dataLayer.sources` entry, validated: the source plugin and the extractors that
    read what it collects, in declaration order."""

    name: str
    source: DataSource
    extractors: list[tuple[str, DataExtractor]]

    @property
    def builtin_scrape(self) -> bool:
        """The source is the data layer's own metrics scrape (metrics-data-source): not
        polled apart; its extractors read every scrape's page."""
        return bool(getattr(self.source, "builtin_scrape", False))


async def fetch_families(
    session: aiohttp.ClientSession,
    url: str,
    families: frozenset[str],
    seconds: float,
    ssl: SSLContext | bool | None = None,
) -> dict[str, list[Sample]]:
    """GET a Prometheus text page and scan the `families` asked for out of it (the rest of
    the page is never parsed). The one scrape of the data layer: the pods' own metrics and
    any other page a source polls (a DCGM exporter's). Raises aiohttp.ClientError,
    TimeoutError, or ValueError (non-200, malformed sample line)."""
    async with session.get(
        url, timeout=aiohttp.ClientTimeout(total=seconds), ssl=ssl if ssl is not None else True
    ) as resp:
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}")
        page = await resp.read()
    return scan_families(page, families)


@dataclass(slots=True)
class RefreshOptions:
    #: A busy pod's scrape interval (GIE's refreshMetricsInterval).
    metrics_interval: float = 0.1
    metrics_timeout: float = 1.0
    models_interval: float = 5.0
    models_path: str = "/v1/models"
    #: Active health checks (GET health_path) beside the scrapes, which a pod whose engine
    #: is stuck but whose /metrics answers would pass; 0 turns them off.
    health_interval: float = 5.0
    health_timeout: float = 1.0
    health_path: str = "/health"
    #: The longest interval a quiet pod backs off to (datalayer/cadence.py); equal to
    #: metrics_interval: every pod every interval.
    idle_metrics_interval: float = 1.0
    #: The metric families read from each page (the plugins' union; vllm_metrics.py).
    families: frozenset[str] = ALL_FAMILIES
    #: Those of `families` read only when a page lacks the one they stand in for
    #: (vllm_metrics.py `stand_ins`).
    stand_ins: dict[str, str] = field(default_factory=dict)


#: Failed health checks in a row that take a pod out of rotation; one success brings it back.
PROBE_UNHEALTHY_AFTER = 2


def _set_health(endpoint: Endpoint) -> None:
    healthy = endpoint.scrape_ok and endpoint.probe_ok
    if healthy != endpoint.healthy:
        endpoint.healthy = healthy
        if healthy:
            log.info("endpoint healthy again", extra={"endpoint": endpoint.name})


class PoolRefresher:
    """Keeps every pod's metrics snapshot, health and model list fresh: one scheduler task
    starts the scrapes that are due (cadence.py decides) and sleeps until the next is due,
    or until the in-flight ledger tells it of a send to a quiet pod; health probes run one
    task per pod on their own, longer interval, on the cadence's grid.

    The model list comes from the pod's `/v1/models`, unless data-layer sources are wired
    (`data.sources` in the config): then those sources are polled instead, on the same
    interval, and their extractors publish the models."""

    def __init__(
        self,
        pool: EndpointPool,
        session: aiohttp.ClientSession,
        options: RefreshOptions,
        sources: list[WiredSource] | None = None,
        load: InFlightLoad | None = None,
    ) -> None:
        self.pool = pool
        self.session = session
        self.options = options
        wired = list(sources or [])
        #: The sources polled apart from the built-in scrape, by kind.
        self.sources = [w for w in wired if w.source.output_type == MODEL_LIST_DATA]
        self.polled = [
            w
            for w in wired
            if w.source.output_type not in (MODEL_LIST_DATA, ENDPOINT_EVENTS)
            and not w.builtin_scrape
        ]
        #: The built-in scrape's source when the config wires one (its URL and TLS), and the
        #: extractors that read every scrape's families.
        scrape = next((w for w in wired if w.builtin_scrape), None)
        self.metrics_source: DataSource | None = scrape.source if scrape else None
        self.page_extractors = list(scrape.extractors) if scrape else []
        #: Extractors told of pods joining and leaving.
        self.watchers: list[tuple[str, EndpointExtractor]] = [
            (name, ext)
            for w in wired
            if w.source.output_type == ENDPOINT_EVENTS
            for name, ext in w.extractors
            if isinstance(ext, EndpointExtractor)
        ]
        self._known: dict[str, Endpoint] = {}
        self._next_poll: dict[str, float] = {}
        self.cadence = ScrapeCadence(
            load or InFlightLoad(), options.metrics_interval, options.idle_metrics_interval
        )
        self._tick: asyncio.Task[None] | None = None
        #: pod name -> (its Endpoint object, its health-probe task)
        self._probes: dict[str, tuple[Endpoint, asyncio.Task[None]]] = {}
        #: Scrapes and model refreshes under way (kept so they are not garbage collected).
        self._jobs: set[asyncio.Task[None]] = set()
        self._next_models: dict[str, float] = {}
        #: Completed scrapes per pod, and passes of the scrape loop (tests and the bench
        #: read them).
        self.scrapes: dict[str, int] = {}
        self.passes = 0
        #: How the pods' pages are read (pages.py), and each pod's page scanner (rescan.py).
        self.pages = PageReader(session)
        self._scanners: dict[str, PageScanner] = {}
        self._running = False
        #: The pass loop's sleep: its future, timer and planned wake, and the last pass.
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._wake_at = math.inf
        self._last_pass = -math.inf
        #: Removes the ledger send listener (`start` adds it).
        self._unlisten: Callable[[], None] | None = None

    async def refresh_once(self) -> None:
        """Scrape every pod once, concurrently (used at start-up before serving)."""
        await asyncio.gather(*(self._refresh(e, models=True) for e in self.pool.endpoints()))

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        self._running = True
        self._unlisten = self.cadence.load.on_send(self._sent)
        self._tick = asyncio.create_task(self._tick_loop(), name="refresh-metrics")
        self.sync()

    def sync(self) -> None:
        """Follow the pool: probe pods that joined (or changed), stop probing those that
        left. Scrapes need nothing: every tick reads the pool as it is. Called after every
        change of a discovered pool."""
        current = {e.name: e for e in self.pool.endpoints()}
        self._notify(current)
        for name, (endpoint, task) in list(self._probes.items()):
            if current.get(name) is not endpoint:
                task.cancel()
                del self._probes[name]
        for name in [n for n in self._next_models if n not in current]:
            del self._next_models[name]
            self.cadence.forget(name)
            self._scanners.pop(name, None)
        now = time.monotonic()
        for name in current:  # a pod that joined learns its models on the next pass
            self._next_models.setdefault(name, now)
        self._rouse(now)  # and is scraped on it (its cadence starts due)
        if self.options.health_interval <= 0:
            return
        for name, endpoint in current.items():
            if name not in self._probes:
                task = asyncio.create_task(self._probe_loop(endpoint), name=f"probe-{name}")
                self._probes[name] = (endpoint, task)

    def _notify(self, current: dict[str, Endpoint]) -> None:
        """Tell the endpoint-notification extractors what joined, changed or left."""
        if not self.watchers:
            return
        events = [(e, True) for n, e in self._known.items() if current.get(n) is not e]
        events += [(e, False) for n, e in current.items() if self._known.get(n) is not e]
        self._known = dict(current)
        for endpoint, removed in events:
            for name, watcher in self.watchers:
                try:
                    watcher.endpoint_changed(endpoint, removed)
                except Exception:
                    log.exception("endpoint extractor %r failed on %s", name, endpoint.name)

    async def _probe_loop(self, endpoint: Endpoint) -> None:
        interval = self.options.health_interval
        on_grid = self.cadence.on_grid
        now = time.monotonic()
        await asyncio.sleep(max(0.0, on_grid(now + random.uniform(0, interval), interval) - now))
        while True:
            await self.probe(endpoint)
            now = time.monotonic()
            # On the scrapes' grid, the probes of many pods share one wake-up of the loop.
            await asyncio.sleep(on_grid(now + interval, interval) - now)

    async def probe(self, endpoint: Endpoint) -> None:
        """One active health check of `endpoint`."""
        url = f"{endpoint.url}{self.options.health_path}"
        try:
            await self.pages.get(url, self.options.health_timeout)
            ok, why = True, ""
        except (OSError, TimeoutError, ValueError, aiohttp.ClientError) as exc:
            ok, why = False, repr(exc)
        if ok:
            endpoint.probe_failures = 0
            endpoint.probe_ok = True
        else:
            endpoint.probe_failures += 1
            if endpoint.probe_ok and endpoint.probe_failures >= PROBE_UNHEALTHY_AFTER:
                endpoint.probe_ok = False
                log.warning(
                    "endpoint failed %d health checks: %s",
                    endpoint.probe_failures,
                    why,
                    extra={"endpoint": endpoint.name},
                )
        _set_health(endpoint)

    async def stop(self) -> None:
        self._running = False
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        tasks = [*(t for _, t in self._probes.values()), *self._jobs]
        if self._tick is not None:
            tasks.append(self._tick)
        self._tick = None
        self._probes.clear()
        self._jobs.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.pages.close()

    async def _tick_loop(self) -> None:
        opts = self.options
        cadence = self.cadence
        now = time.monotonic()
        # Spread the pods' first scrapes and model refreshes over an interval each instead of
        # firing them together; the cadence keeps them spread afterwards.
        for ep in self.pool.endpoints():
            cadence.pod(ep.name).due = now + random.uniform(0, opts.metrics_interval)
            later = now + random.uniform(0, opts.models_interval)
            self._next_models[ep.name] = max(now, cadence.on_grid(later, opts.models_interval))
        # At most one pass a quarter interval (a busy pod's period stays within 1.25
        # intervals), and none while nothing is due: a send to a quiet pod wakes the loop.
        gap = opts.metrics_interval / 4
        while True:
            now = time.monotonic()
            self.tick(now + TIMER_EARLY)
            self._last_pass = now
            self.passes += 1
            await self._sleep_until(max(self._next_pass(), now + gap))

    def _next_pass(self) -> float:
        """When something is next due: a scrape, a polled source, a model list."""
        soonest = min(self.cadence.next_due, min(self._next_models.values(), default=math.inf))
        for wired in self.polled:
            soonest = min(soonest, self._next_poll.get(wired.name, 0.0))
        return soonest

    async def _sleep_until(self, when: float) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._wake_at = when
        self._timer = loop.call_later(max(0.0, when - time.monotonic()), _release, waiter)
        try:
            await waiter
        finally:
            self._timer.cancel()
            self._timer = self._waiter = None

    def _rouse(self, when: float | None = None) -> None:
        """Run the next pass at `when` if that is sooner than planned (no sooner than a
        quarter interval after the last pass); at once when None (a quiet pod was sent
        work)."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if when is None:
            waiter.set_result(None)
            return
        when = max(when, self._last_pass + self.options.metrics_interval / 4)
        if when < self._wake_at and self._timer is not None:
            self._timer.cancel()
            self._wake_at = when
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, when - time.monotonic()), _release, waiter
            )

    def _sent(self, pod: str) -> None:
        """The ledger's send listener: a quiet pod sent work is woken and scraped at once."""
        if not self.cadence.is_quiet(pod):
            return
        endpoint = self.pool.get(pod)
        if endpoint is not None:
            self.cadence.wake(endpoint, time.monotonic())
            self._rouse()

    def tick(self, now: float) -> None:
        """Start the scrapes, polled sources and model refreshes that are due at `now`."""
        for ep in self.cadence.due(self.pool.endpoints(), now):
            self._spawn(self._scrape(ep))
        for wired in self.polled:
            if now >= self._next_poll.get(wired.name, 0.0):
                interval = getattr(wired.source, "interval", None) or self.options.metrics_interval
                self._next_poll[wired.name] = now + interval
                for ep in self.pool.endpoints():
                    self._spawn(self._poll(wired, ep))
        if now >= min(self._next_models.values(), default=float("inf")):
            for ep in self.pool.endpoints():
                if now >= self._next_models.get(ep.name, now):
                    self._next_models[ep.name] = self.cadence.on_grid(
                        now + self.options.models_interval, self.options.models_interval
                    )
                    self._spawn(self._refresh_models_of(ep))

    def _spawn(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.create_task(coro)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _refresh(self, endpoint: Endpoint, *, models: bool) -> None:
        if models:
            await self._refresh_models_of(endpoint)
        await self._scrape(endpoint)
        for wired in self.polled:
            await self._poll(wired, endpoint)

    async def _refresh_models_of(self, endpoint: Endpoint) -> None:
        if endpoint.name in self.pool.static_models:
            return
        if self.sources:
            await self._collect_sources(endpoint)
        else:
            await self._refresh_models(endpoint)

    def _models_timeout(self) -> float:
        return max(self.options.metrics_timeout, 2.0)

    async def _collect_sources(self, endpoint: Endpoint) -> None:
        for wired in self.sources:
            await self._poll(wired, endpoint, self._models_timeout())

    async def _poll(self, wired: WiredSource, endpoint: Endpoint, limit: float = 0.0) -> None:
        """Collect one source from one pod and hand the data to its extractors. A failure is
        logged at debug level: the pod keeps what was published last."""
        try:
            async with asyncio.timeout(limit or self.options.metrics_timeout):
                data = await wired.source.collect(endpoint, self.session)
        except Exception as exc:
            log.debug("data source %r failed for %s: %r", wired.name, endpoint.name, exc)
            return
        _extract(wired.name, wired.extractors, endpoint, data)

    async def _scrape(self, endpoint: Endpoint) -> None:
        self.cadence.started(endpoint.name, time.monotonic())
        ok = False
        try:
            ok = await self._scrape_once(endpoint)
        finally:
            self.scrapes[endpoint.name] = self.scrapes.get(endpoint.name, 0) + 1
            self._rouse(self.cadence.finished(endpoint, ok, time.monotonic()))

    async def _scrape_once(self, endpoint: Endpoint) -> bool:
        source = self.metrics_source
        try:
            if source is not None:
                url, ssl = source.url(endpoint), source.ssl  # type: ignore[attr-defined]
            else:
                url, ssl = f"{endpoint.url}/metrics", None
            page = await self.pages.get(url, self.options.metrics_timeout, ssl)
            scanner = self._scanners.get(endpoint.name)
            if scanner is None:
                scanner = PageScanner(self.options.families, self.options.stand_ins)
                self._scanners[endpoint.name] = scanner
            found = scanner.scan(page)
            snapshot = metrics_from_families(found)
        except (OSError, TimeoutError, ValueError, aiohttp.ClientError) as exc:
            self._failed(endpoint, f"metrics scrape failed: {exc!r}")
            return False
        endpoint.metrics = snapshot
        self.cadence.load.scraped(endpoint.name, snapshot)
        if self.page_extractors:
            _extract("metrics scrape", self.page_extractors, endpoint, found)
        if endpoint.consecutive_failures:
            endpoint.consecutive_failures = 0
        if not endpoint.scrape_ok:
            endpoint.scrape_ok = True
        _set_health(endpoint)
        return True

    def _failed(self, endpoint: Endpoint, why: str) -> None:
        endpoint.consecutive_failures += 1
        if endpoint.scrape_ok and endpoint.consecutive_failures >= UNHEALTHY_AFTER:
            endpoint.scrape_ok = False
            _set_health(endpoint)
            log.warning(
                "endpoint unhealthy after %d failed scrapes: %s",
                endpoint.consecutive_failures,
                why,
                extra={"endpoint": endpoint.name},
            )

    async def _refresh_models(self, endpoint: Endpoint) -> None:
        url = f"{endpoint.url}{self.options.models_path}"
        try:
            cards = parse_model_list(
                orjson.loads(await self.pages.get(url, self._models_timeout()))
            )
        except (OSError, TimeoutError, ValueError, aiohttp.ClientError) as exc:
            log.debug("model list refresh failed for %s: %r", endpoint.name, exc)
            return
        if publish_models(endpoint, cards):
            log.info(
                "endpoint serves models: %s",
                ", ".join(sorted(cards)),
                extra={"endpoint": endpoint.name},
            )


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _extract(
    source: str, extractors: list[tuple[str, DataExtractor]], endpoint: Endpoint, data: object
) -> None:
    for name, extractor in extractors:
        try:
            extractor.extract(endpoint, data)
        except Exception as exc:
            log.debug("data extractor %r failed on %r for %s: %r", name, source, endpoint.name, exc)
