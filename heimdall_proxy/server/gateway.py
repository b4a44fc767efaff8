"""The Gateway: owns the pool, the plugins, the upstream session, and serves one request from
body to relayed response."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from heimdall_proxy.config import GatewayConfig, PluginConfig
from heimdall_proxy.datalayer.pool import EndpointPool, ModelNotFoundError, NoEndpointsError
from heimdall_proxy.datalayer.refresher import PoolRefresher, RefreshOptions
from heimdall_proxy.framework.disagg import read_plan
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.loader import PluginSet, build_plugins
from heimdall_proxy.framework.registry import Registry, load_builtin_plugins
from heimdall_proxy.framework.types import (
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
    SchedulingError,
    SchedulingResult,
)
from heimdall_proxy.observability import GatewayMetrics
from heimdall_proxy.server.errors import GatewayError
from heimdall_proxy.server.headers import client_response_headers, upstream_request_headers
from heimdall_proxy.server.hops import Hops
from heimdall_proxy.server.parse import parse_body

log = logging.getLogger("heimdall_proxy.server")

#: Failures that happen before the upstream sent a response: safe to retry on another pod.
_RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
#: Label used for client-supplied model names the pool does not know (bounded cardinality).
UNKNOWN_MODEL = "unknown"


@dataclass(slots=True)
class ServerOptions:
    host: str = "0.0.0.0"
    port: int = 8000
    response_header: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    metrics_interval: float = 0.1
    metrics_timeout: float = 1.0
    models_interval: float = 5.0
    connect_timeout: float = 5.0
    #: Total time allowed for one upstream attempt; None = unlimited (long generations).
    upstream_timeout: float | None = None
    #: Pods tried per request (the picked one, then the next-best ones).
    max_attempts: int = 3
    pool_name: str = "heimdall"
    #: How long start-up waits for the first metrics and model scrape of every pod.
    startup_timeout: float = 5.0


def _is_stream(resp: aiohttp.ClientResponse) -> bool:
    ctype = resp.headers.get("Content-Type", "")
    return ctype.startswith("text/event-stream") or resp.content_length is None


class Gateway:
    """Everything one gateway process holds. Built synchronously (config errors surface
    before a port is bound); network resources are opened in `lifespan`."""

    def __init__(
        self, config: GatewayConfig, options: ServerOptions, registry: Registry | None = None
    ) -> None:
        self.config = config
        self.options = options
        self.pool = EndpointPool(config.endpoints)
        self.metrics = GatewayMetrics(self.pool, options.pool_name)
        handle = PluginHandle(pool=self.pool, feature_gates=frozenset(config.epp.feature_gates))
        extra = [PluginConfig(type="response-header-handler")] if options.response_header else []
        self.plugins: PluginSet = build_plugins(
            config.epp,
            registry or load_builtin_plugins(),
            handle,
            self.metrics.plugin_timer,
            extra,
        )
        self.metrics.add_sources(self.plugins.plugins.values())
        self._has_prepare = bool(self.plugins.prepare_data or self.plugins.producers)
        self._session: aiohttp.ClientSession | None = None
        self.refresher: PoolRefresher | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the gateway is not started")
        return self._session

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup_ctx: open sessions, take a first scrape, start background work."""
        opts = self.options
        self._session = aiohttp.ClientSession(
            # keep-alive shorter than uvicorn's 5 s, so a pooled connection is never one the
            # pod has already closed
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
            # never keep a pod's Set-Cookie and replay it for another client (and a cookie
            # jar costs a filter per request)
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(
                total=opts.upstream_timeout, sock_connect=opts.connect_timeout
            ),
        )
        data_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self.refresher = PoolRefresher(
            self.pool,
            data_session,
            RefreshOptions(opts.metrics_interval, opts.metrics_timeout, opts.models_interval),
            self.plugins.data_sources,
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
            for plugin in reversed(self.plugins.lifecycle):
                if plugin in started:
                    try:
                        await plugin.stop()
                    except Exception:
                        log.exception("plugin %r failed to stop", plugin)
            await self.refresher.stop()
            await data_session.close()
            await self._session.close()
            self._session = None

    # ---- request path ------------------------------------------------------------------

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.options.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise GatewayError(
                413, f"The request body exceeds {limit} bytes.", code="request_too_large"
            )
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise GatewayError(
                413, f"The request body exceeds {limit} bytes.", code="request_too_large"
            ) from exc

    async def handle(self, request: web.Request, api: ApiKind) -> web.StreamResponse:
        """Serve one inference request end to end."""
        started = time.perf_counter()
        model_label = UNKNOWN_MODEL
        try:
            body = await self._read_body(request)
            ireq = parse_body(api, request.path, body, request.headers)
            candidates = self._candidates(ireq)
            model_label = ireq.model
            state = CycleState()
            if self._has_prepare:
                await self._prepare(ireq, state, candidates)
            t0 = time.perf_counter()
            try:
                result = self.plugins.scheduler.schedule(state, ireq, candidates)
            except SchedulingError as exc:
                raise GatewayError(
                    503,
                    f"No endpoint can serve the request: {exc}",
                    code="no_endpoint_available",
                    headers={"Retry-After": "1"},
                ) from exc
            self.metrics.scheduler_duration.observe(time.perf_counter() - t0)
        except GatewayError as exc:
            self.metrics.errors.labels(model_label, model_label, exc.code or str(exc.status)).inc()
            return exc.response()

        running = self.metrics.running.labels(model_label)
        running.inc()
        try:
            return await self._relay(request, ireq, state, result)
        except GatewayError as exc:
            self.metrics.errors.labels(model_label, model_label, exc.code or str(exc.status)).inc()
            return exc.response()
        finally:
            running.dec()
            self.metrics.duration.labels(model_label, model_label).observe(
                time.perf_counter() - started
            )

    def _candidates(self, ireq: InferenceRequest) -> list[Endpoint]:
        try:
            if ireq.model:
                return self.pool.candidates(ireq.model)
            if not self.pool.endpoints():
                raise NoEndpointsError("the pool has no endpoints")
            return self.pool.healthy() or self.pool.endpoints()
        except ModelNotFoundError as exc:
            raise GatewayError(
                404,
                f"The model `{ireq.model}` does not exist.",
                code="model_not_found",
                param="model",
            ) from exc
        except NoEndpointsError as exc:
            raise GatewayError(
                503,
                "No model server is configured.",
                code="no_endpoint_available",
                headers={"Retry-After": "1"},
            ) from exc

    async def _prepare(
        self, ireq: InferenceRequest, state: CycleState, candidates: list[Endpoint]
    ) -> None:
        for plugin in self.plugins.prepare_data:
            try:
                await plugin.prepare_data(ireq, candidates)
            except GatewayError:
                raise
            except RequestError as exc:
                # a deliberate answer (e.g. an unknown previous_response_id), not a failure
                raise GatewayError.from_request_error(exc) from exc
            except Exception:
                # prepare-data plugins fail open: the request goes on without their data
                log.exception("prepare-data plugin %r failed", getattr(plugin, "name", plugin))
        for producer in self.plugins.producers:
            try:
                await producer.produce(state, ireq, candidates)
            except Exception:
                log.exception("producer %r failed", getattr(producer, "name", producer))

    async def _relay(
        self,
        request: web.Request,
        ireq: InferenceRequest,
        state: CycleState,
        result: SchedulingResult,
    ) -> web.StreamResponse:
        body = orjson.dumps(ireq.data) if ireq.body_modified else ireq.body
        headers = upstream_request_headers(request.headers)
        # a disaggregated plan's encode and prefill hops, once, before any decode attempt
        prefill: Endpoint | None = None
        if read_plan(state) is not None:
            prefill, body = await Hops(self.session, self.metrics, self.options.max_attempts).run(
                ireq, state, headers, body
            )
        tried = []
        target = result.primary.targets[0]
        order: list[Endpoint] | None = None  # the fallback order, built only when needed
        attempt = 0
        while True:
            ctx = RequestContext(ireq, state, result, target, prefill=prefill, attempt=attempt)
            response = await self._attempt(request, ctx, body, headers)
            if response is not None:
                return response
            tried.append(f"{target.name} ({ctx.error})")
            if order is None:
                order = result.fallback_order()[: max(1, self.options.max_attempts)]
            attempt += 1
            if attempt >= len(order):
                break
            target = order[attempt]
        raise GatewayError(
            502,
            "No model server could be reached: " + "; ".join(tried),
            code="upstream_unreachable",
        )

    async def _attempt(
        self,
        request: web.Request,
        ctx: RequestContext,
        body: bytes,
        base_headers: CIMultiDict[str],
    ) -> web.StreamResponse | None:
        """One try on ctx.target. Returns None when the pod failed before sending a response
        (the caller moves on to the next pod)."""
        target = ctx.target
        if self.plugins.pre_request:
            await self._hooks_pre_request(ctx)
        upstream: aiohttp.ClientResponse | None = None
        complete = False
        try:
            headers = base_headers
            if ctx.upstream_headers:
                headers = base_headers.copy()
                headers.update(ctx.upstream_headers)
            url = URL(f"{target.url}{request.raw_path}", encoded=True)
            try:
                upstream = await self.session.request(
                    request.method, url, data=body, headers=headers
                )
            except _RETRYABLE as exc:
                self._attempt_failed(ctx, "connect", exc)
                return None
            ctx.status = upstream.status
            ctx.upstream_response_headers = upstream.headers
            if self.plugins.response_received:
                await self._hooks_response_received(ctx)
            out_headers = client_response_headers(upstream.headers)
            if ctx.response_headers:
                out_headers.update(ctx.response_headers)
            if _is_stream(upstream):
                response = await self._stream(request, upstream, ctx, out_headers)
                complete = True
                return response
            try:
                payload = await upstream.read()
            except _RETRYABLE as exc:
                self._attempt_failed(ctx, "read", exc)
                return None
            complete = True
            ctx.response_body = payload
            self._count(ctx)
            return web.Response(status=upstream.status, body=payload, headers=out_headers)
        except asyncio.CancelledError:
            ctx.error = ctx.error or "client disconnected"
            raise
        finally:
            if upstream is not None:
                if complete and ctx.error is None:
                    upstream.release()
                else:
                    upstream.close()
            if self.plugins.response_complete:
                await self._hooks_response_complete(ctx)

    def _attempt_failed(self, ctx: RequestContext, stage: str, exc: BaseException) -> None:
        ctx.error = f"{stage} failed: {type(exc).__name__}: {exc}"
        self.metrics.upstream_failures.labels(ctx.target.name, stage).inc()
        log.warning(
            "upstream attempt failed before a response; trying the next pod",
            extra={
                "endpoint": ctx.target.name,
                "error": ctx.error,
                "request_id": ctx.request.request_id,
            },
        )
        return None

    def _count(self, ctx: RequestContext) -> None:
        model = ctx.request.model or UNKNOWN_MODEL
        self.metrics.requests.labels(model, model, ctx.target.name, str(ctx.status)).inc()

    async def _stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        ctx: RequestContext,
        headers: CIMultiDict[str],
    ) -> web.StreamResponse:
        """Relay chunk by chunk as bytes arrive. After prepare() nothing can be retried: an
        upstream failure aborts the client connection so the client sees a broken stream,
        never a clean but truncated one."""
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        read = upstream.content.readany
        hooks = self.plugins.response_streaming
        first = True
        while True:
            try:
                chunk = await read()
            except _RETRYABLE as exc:
                ctx.error = f"upstream failed mid-stream: {type(exc).__name__}: {exc}"
                self.metrics.upstream_failures.labels(ctx.target.name, "stream").inc()
                log.warning(
                    "upstream failed mid-stream",
                    extra={
                        "endpoint": ctx.target.name,
                        "error": ctx.error,
                        "request_id": ctx.request.request_id,
                    },
                )
                if request.transport is not None:
                    request.transport.abort()
                return response
            if not chunk:
                break
            try:
                await response.write(chunk)
            except ConnectionError:
                ctx.error = "client disconnected"
                return response
            if first:
                first = False
                model = ctx.request.model or UNKNOWN_MODEL
                self.metrics.ttft.labels(model, model).observe(
                    time.monotonic() - ctx.request.received_at
                )
            for hook in hooks:
                try:
                    await hook.response_streaming(ctx, chunk)
                except Exception:
                    log.exception("response_streaming hook %r failed", getattr(hook, "name", hook))
        self._count(ctx)
        try:
            await response.write_eof()
        except ConnectionError:
            ctx.error = "client disconnected"
        return response

    # ---- hooks (a failing hook is logged, never fails the request) ------------------------

    async def _hooks_pre_request(self, ctx: RequestContext) -> None:
        for hook in self.plugins.pre_request:
            try:
                await hook.pre_request(ctx)
            except Exception:
                log.exception("pre_request hook %r failed", getattr(hook, "name", hook))

    async def _hooks_response_received(self, ctx: RequestContext) -> None:
        for hook in self.plugins.response_received:
            try:
                await hook.response_received(ctx)
            except Exception:
                log.exception("response_received hook %r failed", getattr(hook, "name", hook))

    async def _hooks_response_complete(self, ctx: RequestContext) -> None:
        for hook in self.plugins.response_complete:
            try:
                await hook.response_complete(ctx)
            except Exception:
                log.exception("response_complete hook %r failed", getattr(hook, "name", hook))
