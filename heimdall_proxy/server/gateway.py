"""The Gateway: wiring, start and stop. It owns the pool, the plugins, the upstream session
and the background work, and hands each request to the director (parse -> schedule) and then
the relay (hops, attempts, streaming).

Built synchronously, so config errors surface before a port is bound; network resources are
opened in `lifespan`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from heimdall_proxy.config import GatewayConfig, PluginConfig
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.datalayer.refresher import PoolRefresher, RefreshOptions
from heimdall_proxy.datalayer.vllm_metrics import needed_families
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.loader import PluginSet, build_plugins
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.framework.types import ApiKind
from heimdall_proxy.observability import GatewayMetrics
from heimdall_proxy.server.answers import UNKNOWN_MODEL
from heimdall_proxy.server.auth import caller_of
from heimdall_proxy.server.director import Director
from heimdall_proxy.server.errors import render
from heimdall_proxy.server.flow.metrics import FlowMetrics
from heimdall_proxy.server.flow.wiring import build_flow
from heimdall_proxy.server.hooks import Hooks
from heimdall_proxy.server.hops import Hops
from heimdall_proxy.server.options import ServerOptions
from heimdall_proxy.server.outliers import OutlierDetector
from heimdall_proxy.server.relay import Relay
from heimdall_proxy.server.tracing import RequestTrace, Tracing, configure

log = logging.getLogger(__name__)


def _session(**kwargs: object) -> aiohttp.ClientSession:
    """A pooled session that keeps no cookies. Keep-alive shorter than uvicorn's 5 s, so a
    pooled connection is never one the pod has already closed; no cookie jar, so a pod's
    Set-Cookie is never replayed for another client (and a jar costs a filter per request)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
        cookie_jar=aiohttp.DummyCookieJar(),
        **kwargs,  # type: ignore[arg-type]
    )


class Gateway:
    """Everything one gateway process holds."""

    def __init__(self, config: GatewayConfig, options: ServerOptions, registry: Registry) -> None:
        self.config = config
        self.options = options
        self.pool = EndpointPool(config.endpoints)
        self.metrics = GatewayMetrics(self.pool, options.pool_name)
        handle = PluginHandle(pool=self.pool, feature_gates=frozenset(config.epp.feature_gates))
        extra = [PluginConfig(type="response-header-handler")] if options.response_header else []
        self.plugins: PluginSet = build_plugins(
            config.epp,
            registry,
            handle,
            self.metrics.plugin_timer,
            extra,
        )
        self.metrics.add_sources(self.plugins.plugins.values())
        self.outliers = OutlierDetector(
            config.outlier_detection, lambda pod: self.metrics.ejections.labels(pod).inc()
        )
        self.load = handle.load
        self.flow = build_flow(
            config, self.plugins, registry, handle,
            FlowMetrics(self.metrics.registry, options.pool_name),
        )  # fmt: skip
        self.director = Director(
            self.pool, self.plugins, self.metrics, options.trust_client_transfer_params,
            self.outliers, self.flow,
        )  # fmt: skip
        self.hooks = Hooks(self.plugins)
        self._session: aiohttp.ClientSession | None = None
        self._relay: Relay | None = None
        self.refresher: PoolRefresher | None = None
        #: Set on SIGTERM while the drain delay runs: /ready answers 503.
        self.draining = False
        #: OpenTelemetry spans per request (server/tracing.py); None, the default, is off.
        self.tracing: Tracing | None = configure(options.otel)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the gateway is not started")
        return self._session

    @property
    def relay(self) -> Relay:
        if self._relay is None:
            raise RuntimeError("the gateway is not started")
        return self._relay

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup_ctx: open sessions, take a first scrape, start background work."""
        opts = self.options
        self._session = _session(
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(
                total=opts.upstream_timeout, sock_connect=opts.connect_timeout
            ),
        )
        hops = Hops(self._session, self.metrics, opts.max_attempts, self.load)
        timeouts = {
            stream: aiohttp.ClientTimeout(
                total=opts.upstream_timeout, sock_connect=opts.connect_timeout, sock_read=read
            )
            for stream, read in ((False, opts.first_byte_timeout), (True, opts.stream_idle_timeout))
        }
        self._relay = Relay(
            self._session, self.hooks, hops, self.metrics, opts.max_attempts, self.outliers,
            timeouts, self.load, self.director.fallback,
        )  # fmt: skip
        data_session = _session()
        self.refresher = PoolRefresher(
            self.pool,
            data_session,
            RefreshOptions(
                opts.metrics_interval,
                opts.metrics_timeout,
                opts.models_interval,
                health_interval=opts.health_interval,
                health_timeout=opts.health_timeout,
                idle_metrics_interval=opts.idle_metrics_interval,
                families=needed_families(self.plugins.plugins.values()),
            ),
            self.plugins.data_sources,
            self.load,
        )
        started: list[object] = []
        try:
            try:
                await asyncio.wait_for(self.refresher.refresh_once(), opts.startup_timeout)
            except TimeoutError:
                log.warning("not every pod answered within %.1fs of start-up", opts.startup_timeout)
            self.refresher.start()
            for plugin in self.plugins.lifecycle:
                await plugin.start()
                started.append(plugin)
            yield
        finally:
            if self.tracing is not None:
                self.tracing.shutdown()
            for plugin in reversed(self.plugins.lifecycle):
                if plugin in started:
                    try:
                        await plugin.stop()
                    except Exception:
                        log.exception("plugin %r failed to stop", plugin)
            await self.flow.stop()
            await self.refresher.stop()
            await data_session.close()
            await self._session.close()
            self._session = None
            self._relay = None

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.options.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(
                413, f"The request body exceeds {limit} bytes.", code="request_too_large"
            )
        try:
            if request.content.is_eof():
                # The whole body came with the headers (the usual case): nothing to wait for,
                # so no timer and no task (asyncio.wait_for wraps the read in a Task).
                return await request.read()
            async with asyncio.timeout(self.options.body_timeout):
                return await request.read()
        except TimeoutError as exc:
            raise RequestError(
                408,
                f"The request body was not received within {self.options.body_timeout:g}s.",
                code="request_timeout",
            ) from exc
        except web.HTTPRequestEntityTooLarge as exc:
            raise RequestError(
                413, f"The request body exceeds {limit} bytes.", code="request_too_large"
            ) from exc

    def handle(self, request: web.Request, api: ApiKind) -> Coroutine[Any, Any, web.StreamResponse]:
        """Serve one inference request end to end (await the result). A plain function that
        hands back the coroutine to await, so tracing off adds no coroutine frame."""
        if self.tracing is not None:
            return self._handle_traced(request, api, self.tracing)
        return self._handle(request, api, None)

    async def _handle_traced(
        self, request: web.Request, api: ApiKind, tracing: Tracing
    ) -> web.StreamResponse:
        spans = tracing.request(request.method, request.path, request.headers)
        status: int | None = 500
        try:
            response = await self._handle(request, api, spans)
            status = response.status
            return response
        finally:
            spans.end(status)

    async def _handle(
        self, request: web.Request, api: ApiKind, spans: RequestTrace | None
    ) -> web.StreamResponse:
        started = time.perf_counter()
        model_label = UNKNOWN_MODEL
        try:
            body = await self._read_body(request)
            decision = await self.director.decide(
                api, request.path, body, request.headers, caller=caller_of(request), spans=spans
            )
            model_label = decision.request.model
        except RequestError as exc:
            self.metrics.errors.labels(model_label, model_label, exc.code or str(exc.status)).inc()
            return render(exc)

        running = self.metrics.running.labels(model_label)
        running.inc()
        try:
            return await self.relay.relay(request, decision)
        except RequestError as exc:
            self.metrics.errors.labels(model_label, model_label, exc.code or str(exc.status)).inc()
            return render(exc)
        finally:
            if decision.admission is not None:
                decision.admission.finish()
            running.dec()
            self.metrics.duration.labels(model_label, model_label).observe(
                time.perf_counter() - started
            )


#: Where the application keeps its gateway (read by the route handlers).
GATEWAY = web.AppKey("gateway", Gateway)
