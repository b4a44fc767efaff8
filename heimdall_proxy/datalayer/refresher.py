"""Background refresh of every pod: /metrics on a short interval, /v1/models on a longer one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass

import aiohttp
import orjson

from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.datalayer.vllm_metrics import parse_vllm_metrics
from heimdall_proxy.framework.loader import WiredSource
from heimdall_proxy.framework.types import Endpoint, parse_model_list, publish_models

log = logging.getLogger(__name__)

#: Consecutive failed scrapes after which a pod is taken out of rotation.
UNHEALTHY_AFTER = 3


@dataclass(slots=True)
class RefreshOptions:
    metrics_interval: float = 0.1
    metrics_timeout: float = 1.0
    models_interval: float = 5.0
    models_path: str = "/v1/models"
    #: Active health checks (GET health_path) beside the scrapes, which a pod whose engine
    #: is stuck but whose /metrics answers would pass; 0 turns them off.
    health_interval: float = 5.0
    health_timeout: float = 1.0
    health_path: str = "/health"


#: Failed health checks in a row that take a pod out of rotation; one success brings it back.
PROBE_UNHEALTHY_AFTER = 2


def _set_health(endpoint: Endpoint) -> None:
    healthy = endpoint.scrape_ok and endpoint.probe_ok
    if healthy != endpoint.healthy:
        endpoint.healthy = healthy
        if healthy:
            log.info("endpoint healthy again", extra={"endpoint": endpoint.name})


class PoolRefresher:
    """One task per pod keeps its metrics snapshot, health and model list fresh.

    The model list comes from the pod's `/v1/models`, unless data-layer sources are wired
    (`data.sources` in the config): then those sources are polled instead, on the same
    interval, and their extractors publish the models."""

    def __init__(
        self,
        pool: EndpointPool,
        session: aiohttp.ClientSession,
        options: RefreshOptions,
        sources: list[WiredSource] | None = None,
    ) -> None:
        self.pool = pool
        self.session = session
        self.options = options
        self.sources = list(sources or [])
        #: pod name -> (its Endpoint object, its scrape and probe tasks)
        self._tasks: dict[str, tuple[Endpoint, list[asyncio.Task[None]]]] = {}
        self._running = False

    async def refresh_once(self) -> None:
        """Scrape every pod once, concurrently (used at start-up before serving)."""
        await asyncio.gather(*(self._refresh(e, models=True) for e in self.pool.endpoints()))

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        self._running = True
        self.sync()

    def sync(self) -> None:
        """Follow the pool: start scraping pods that joined (or changed), stop for those that
        left. Called after every change of a discovered pool."""
        current = {e.name: e for e in self.pool.endpoints()}
        for name, (endpoint, tasks) in list(self._tasks.items()):
            if current.get(name) is not endpoint:
                for task in tasks:
                    task.cancel()
                del self._tasks[name]
        for name, endpoint in current.items():
            if name in self._tasks:
                continue
            tasks = [asyncio.create_task(self._loop(endpoint), name=f"refresh-{name}")]
            if self.options.health_interval > 0:
                tasks.append(asyncio.create_task(self._probe_loop(endpoint), name=f"probe-{name}"))
            self._tasks[name] = (endpoint, tasks)

    async def _probe_loop(self, endpoint: Endpoint) -> None:
        interval = self.options.health_interval
        await asyncio.sleep(random.uniform(0, interval))
        while True:
            await self.probe(endpoint)
            await asyncio.sleep(interval)

    async def probe(self, endpoint: Endpoint) -> None:
        """One active health check of `endpoint`."""
        timeout = aiohttp.ClientTimeout(total=self.options.health_timeout)
        try:
            async with self.session.get(
                f"{endpoint.url}{self.options.health_path}", timeout=timeout
            ) as resp:
                ok = resp.status == 200
                why = f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
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
        tasks = [t for _, ts in self._tasks.values() for t in ts]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self, endpoint: Endpoint) -> None:
        opts = self.options
        # Spread the pods' scrapes over the interval instead of firing them together.
        await asyncio.sleep(random.uniform(0, opts.metrics_interval))
        next_models = time.monotonic() + opts.models_interval
        while True:
            now = time.monotonic()
            due = now >= next_models
            if due:
                next_models = now + opts.models_interval
            await self._refresh(endpoint, models=due)
            await asyncio.sleep(opts.metrics_interval)

    async def _refresh(self, endpoint: Endpoint, *, models: bool) -> None:
        if models and endpoint.name not in self.pool.static_models:
            if self.sources:
                await self._collect_sources(endpoint)
            else:
                await self._refresh_models(endpoint)
        await self._scrape(endpoint)

    def _models_timeout(self) -> float:
        return max(self.options.metrics_timeout, 2.0)

    async def _collect_sources(self, endpoint: Endpoint) -> None:
        for wired in self.sources:
            try:
                async with asyncio.timeout(self._models_timeout()):
                    data = await wired.source.collect(endpoint, self.session)
            except Exception as exc:
                log.debug("data source %r failed for %s: %r", wired.name, endpoint.name, exc)
                continue
            for name, extractor in wired.extractors:
                try:
                    extractor.extract(endpoint, data)
                except Exception as exc:
                    log.debug(
                        "data extractor %r failed on %r for %s: %r",
                        name,
                        wired.name,
                        endpoint.name,
                        exc,
                    )

    async def _scrape(self, endpoint: Endpoint) -> None:
        timeout = aiohttp.ClientTimeout(total=self.options.metrics_timeout)
        try:
            async with self.session.get(f"{endpoint.url}/metrics", timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = await resp.text()
            snapshot = parse_vllm_metrics(text)
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
            self._failed(endpoint, f"metrics scrape failed: {exc!r}")
            return
        endpoint.metrics = snapshot
        endpoint.consecutive_failures = 0
        endpoint.scrape_ok = True
        _set_health(endpoint)

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
        timeout = aiohttp.ClientTimeout(total=self._models_timeout())
        try:
            async with self.session.get(
                f"{endpoint.url}{self.options.models_path}", timeout=timeout
            ) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                cards = parse_model_list(orjson.loads(await resp.read()))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("model list refresh failed for %s: %r", endpoint.name, exc)
            return
        if publish_models(endpoint, cards):
            log.info(
                "endpoint serves models: %s",
                ", ".join(sorted(cards)),
                extra={"endpoint": endpoint.name},
            )
