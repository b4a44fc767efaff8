"""The Gateway: wiring, start and stop, and the transport of a request. It owns the routing in
force (pool, plugins, director), the upstream client and sessions and the background work;
it reads each request's body and hands it to the director, which runs the request's life.

Built synchronously, so config errors surface before a port is bound; network resources are
opened in `lifespan`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from heimdall_proxy.config.build import PluginSet
from heimdall_proxy.config.gateway import GatewayConfig
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.datalayer.refresher import PoolRefresher
from heimdall_proxy.flowcontrol.controller import FlowController
from heimdall_proxy.flowcontrol.metrics import FlowMetrics
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.observability.metrics import GatewayMetrics
from heimdall_proxy.observability.tracing import RequestTrace, Tracing, configure
from heimdall_proxy.resilience.outliers import OutlierDetector
from heimdall_proxy.server.answers import UNKNOWN_MODEL
from heimdall_proxy.server.director import Director
from heimdall_proxy.server.errors import render
from heimdall_proxy.server.hooks import Hooks
from heimdall_proxy.server.picks import PickLog
from heimdall_proxy.server.relay import Relay
from heimdall_proxy.server.routing import Routing
from heimdall_proxy.upstream import KEEPALIVE, UpstreamClient, UpstreamTimeouts

log = logging.getLogger(__name__)


def _data_session(pod_key: str | None = None) -> aiohttp.ClientSession:
    """The scrapes' pooled session, with the pods' own key when they need one (vLLM's
    --api-key guards /v1/models). No cookie jar: a pod's Set-Cookie is never replayed."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE),
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"Authorization": f"Bearer {pod_key}"} if pod_key else None,
    )


class Gateway:
    """Everything one gateway process holds: its options, metrics, upstream client and the
    routing in force (pool, plugins, director, relay), which `reload` swaps."""

    def __init__(self, config: GatewayConfig, options: ServerOptions, registry: Registry) -> None:
        self.options = options
        self.registry = registry
        first = EndpointPool(config.endpoints)
        self.metrics = GatewayMetrics(first, options.pool_name)
        self.flow_metrics = FlowMetrics(self.metrics.registry, options.pool_name)
        self.load = InFlightLoad()
        self.routing = Routing(
            config, options, registry, self.metrics, self.flow_metrics, self.load
        )
        #: The live page's recent picks (`--live-page`), kept across reloads.
        self.picks = PickLog() if options.live_page else None
        self.routing.director.picks = self.picks
        self.routing.publish()
        self._data_session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamClient | None = None
        self._timeouts: dict[bool, UpstreamTimeouts] = {}
        self._reloading = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        #: Routings a reload replaced and that are not stopped yet.
        self._replaced: set[Routing] = set()
        #: Set on SIGTERM while the drain delay runs: /ready answers 503.
        self.draining = False
        #: Serves one inference request of a caller end to end (await the result): with
        #: tracing off the untraced coroutine function itself, so no function runs in
        #: between on every request; set with `tracing`.
        self.handle: Callable[[web.Request, str], Awaitable[web.StreamResponse]]
        self.tracing = configure(options.otel)

    @property
    def tracing(self) -> Tracing | None:
        """OpenTelemetry spans per request (observability/tracing.py); None, the default, is off."""
        return self._tracing

    @tracing.setter
    def tracing(self, tracing: Tracing | None) -> None:
        self._tracing = tracing
        self.handle = self._handle if tracing is None else self._handle_traced

    # The routing in force, by its parts (route handlers and tests read these).
    @property
    def config(self) -> GatewayConfig:
        return self.routing.config

    @property
    def pool(self) -> EndpointPool:
        return self.routing.pool

    @property
    def plugins(self) -> PluginSet:
        return self.routing.plugins

    @property
    def director(self) -> Director:
        return self.routing.director

    @property
    def flow(self) -> FlowController:
        return self.routing.flow

    @property
    def hooks(self) -> Hooks:
        return self.routing.hooks

    @property
    def outliers(self) -> OutlierDetector:
        return self.routing.outliers

    @property
    def refresher(self) -> PoolRefresher | None:
        return self.routing.refresher

    @property
    def relay(self) -> Relay:
        if self.routing.relay is None:
            raise RuntimeError("the gateway is not started")
        return self.routing.relay

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup_ctx: open the clients, take a first scrape, start background work.
        Requests and their disaggregation hops go to the pods through the upstream client
        (heimdall_proxy/upstream: aiohttp's would be most of a forwarded request's cost);
        scrapes and health checks through aiohttp's, `_data_session`."""
        opts = self.options
        self._upstream = UpstreamClient(opts.connect_timeout)
        self._timeouts = {
            stream: UpstreamTimeouts(read, opts.upstream_timeout)
            for stream, read in ((False, opts.first_byte_timeout), (True, opts.stream_idle_timeout))
        }
        self._data_session = _data_session(opts.upstream_api_key)
        try:
            await self.routing.start(self._upstream, self._data_session, self._timeouts)
            yield
        finally:
            if self.tracing is not None:
                self.tracing.shutdown()
            await self.stop_replaced()
            await self.routing.stop()
            await self._data_session.close()
            await self._upstream.close()
            self._data_session = self._upstream = None

    async def reload(self, config: GatewayConfig) -> None:
        """Swap in the routing of `config`: build it (raises ConfigError, and the routing in
        force stays), start it (its first scrape, its plugins), then make it the one new
        requests take, in one step. The old routing serves its requests in flight to the end
        and is stopped after them (at most `drain_timeout` later)."""
        async with self._reloading:
            if self._data_session is None or self._upstream is None:
                raise RuntimeError("the gateway is not started")
            old = self.routing
            await asyncio.to_thread(self.registry.preload, (p.type for p in config.epp.plugins))
            new = Routing(
                config, self.options, self.registry, self.metrics, self.flow_metrics,
                self.load, previous=old,
            )  # fmt: skip
            new.director.picks = self.picks
            await new.start(self._upstream, self._data_session, self._timeouts)
            new.inherit(old)
            old.unpublish()
            self.routing = new
            new.publish()
            self._replaced.add(old)
            task = asyncio.create_task(self._retire(old))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, old: Routing) -> None:
        try:
            await asyncio.wait_for(old.drained(), self.options.drain_timeout)
        except TimeoutError:
            log.warning(
                "%d requests still on the replaced config after %.0fs; stopping its plugins",
                old.in_flight,
                self.options.drain_timeout,
            )
        await self._stop_replaced(old)

    async def stop_replaced(self) -> None:
        """Stop the routings reloads replaced, now, whatever they still serve (shutdown).
        Cancelling their wait for the drain (or cancelling it before it ran) stops nothing:
        their plugins must still leave the replicas' hub and close their clients."""
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for old in list(self._replaced):
            await self._stop_replaced(old)

    async def _stop_replaced(self, old: Routing) -> None:
        if old in self._replaced:  # once, whether the drain or shutdown gets here first
            self._replaced.discard(old)
            await old.stop()

    async def drained(self) -> None:
        """Return once no inference request is in flight, on the routing in force or on one
        a reload replaced (shutdown's drain)."""
        for routing in (self.routing, *self._replaced):
            await routing.drained()

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.options.max_body_bytes
        declared = request.content_length
        if declared is not None and declared > limit:
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
        except RequestPayloadError as exc:  # e.g. Content-Encoding: gzip on a body that is not
            encoding = request.headers.get("Content-Encoding", "")
            raise RequestError(
                400,
                "The request body could not be read"
                + (f" as Content-Encoding {encoding!r}." if encoding else "."),
                code="invalid_body",
            ) from exc

    async def _handle_traced(self, request: web.Request, caller: str = "") -> web.StreamResponse:
        """`_handle` inside a request span."""
        assert self._tracing is not None
        spans = self._tracing.request(request.method, request.path, request.headers)
        status: int | None = 500
        try:
            response = await self._handle(request, caller, spans)
            status = response.status
            return response
        finally:
            spans.end(status)

    async def _handle(
        self,
        request: web.Request,
        caller: str = "",
        spans: RequestTrace | None = None,
    ) -> web.StreamResponse:
        """Read the body of one inference request of `caller` (as the auth guard identified
        it) and have the director serve it. The routing in force when a request arrives
        serves it to its end, whatever a reload does meanwhile."""
        started = time.perf_counter()
        routing = self.routing
        routing.in_flight += 1
        try:
            try:
                body = await self._read_body(request)
            except RequestError as exc:
                self.metrics.errors.labels(
                    UNKNOWN_MODEL, UNKNOWN_MODEL, exc.code or str(exc.status)
                ).inc()
                return render(exc, request.path)
            return await routing.director.serve(request, body, caller, spans, started)
        finally:
            routing.leave()


#: Where the application keeps its gateway (read by the route handlers).
GATEWAY = web.AppKey("gateway", Gateway)
