"""The relay: the transport of a scheduled request to the pods.

`prepare` runs a disaggregated plan's encode and prefill hops (server/hops.py) and gives the
body and headers every attempt sends; `attempt` is one try on one pod: its in-flight count in
the ledger, its pre-request and response hooks, and the answer streamed or sent back. Which
pod each attempt goes to, and whether there is another, is the director's call. Once the
response has started nothing can be retried: an upstream failure mid-stream aborts the
client connection, so the client sees a broken stream, never a clean but truncated one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import orjson
from aiohttp import web
from multidict import CIMultiDict

from heimdall_proxy.config.gateway import OutlierDetectionConfig
from heimdall_proxy.framework.disagg import DISAGG_PLAN_KEY, read_plan
from heimdall_proxy.framework.inflight import InFlightLoad, LoadEstimate
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, RequestContext
from heimdall_proxy.observability.metrics import GatewayMetrics
from heimdall_proxy.observability.tracing import RequestTrace
from heimdall_proxy.resilience.outliers import OutlierDetector, Verdicts
from heimdall_proxy.resilience.retry import RETRY_STATUSES
from heimdall_proxy.server.answers import RETRYABLE, Answers, is_stream
from heimdall_proxy.server.headers import (
    FORWARD_CLIENT_CREDENTIALS,
    UpstreamCredentials,
    client_response_headers,
    upstream_request_headers,
)
from heimdall_proxy.server.hooks import Hooks
from heimdall_proxy.server.hops import Hops
from heimdall_proxy.upstream import NO_LIMITS, UpstreamClient, UpstreamResponse, UpstreamTimeouts

log = logging.getLogger(__name__)


class Relay:
    def __init__(
        self,
        client: UpstreamClient,
        hooks: Hooks,
        hops: Hops,
        metrics: GatewayMetrics,
        outliers: OutlierDetector | None = None,
        timeouts: Mapping[bool, UpstreamTimeouts] | None = None,
        load: InFlightLoad | None = None,
        credentials: UpstreamCredentials = FORWARD_CLIENT_CREDENTIALS,
        estimate: Callable[[RequestContext], tuple[int, int, int]] | None = None,
    ) -> None:
        self.client = client
        #: What the pods get for Authorization (never a gateway key).
        self.credentials = credentials
        self.hooks = hooks
        self.hops = hops
        self.metrics = metrics
        #: per request kind (streamed?): the read limit is the stream's idle limit, or the
        #: wait for a whole non-streamed answer; none given: no limits
        self.timeouts = dict(timeouts or {False: NO_LIMITS, True: NO_LIMITS})
        self.outliers = outliers or OutlierDetector(OutlierDetectionConfig(consecutiveFailures=0))
        #: What this gateway has in flight on each pod (scorers and detectors read it), and
        #: what an attempt adds to it (inflight-load-producer's estimate, else the defaults).
        self.load = load or InFlightLoad()
        self.estimate = estimate or LoadEstimate()
        self.answers = Answers(hooks, metrics, self.outliers, self.load)

    async def prepare(
        self, request: web.Request, ireq: InferenceRequest, state: CycleState
    ) -> tuple[bytes, CIMultiDict[str], Endpoint | None]:
        """What every attempt of `ireq` sends (its body and headers), after the encode and
        prefill hops of a disaggregated plan, run once before any decode attempt; and the
        prefill pod, if one served."""
        body = orjson.dumps(ireq.data) if ireq.body_modified else ireq.body
        headers = upstream_request_headers(request.headers, self.credentials)
        prefill: Endpoint | None = None
        if DISAGG_PLAN_KEY in state and read_plan(state) is not None:  # no call without one
            prefill, body = await self.hops.run(ireq, state, headers, body)
        return body, headers, prefill

    async def traced(
        self,
        spans: RequestTrace,
        request: web.Request,
        ctx: RequestContext,
        body: bytes,
        base_headers: CIMultiDict[str],
        verdicts: Verdicts,
        another_pod: Callable[[], bool],
    ) -> web.StreamResponse | None:
        """`_attempt` inside an `upstream attempt` span whose traceparent the pod receives."""
        target = ctx.target
        attributes = {
            "heimdall.attempt": ctx.attempt,
            "heimdall.pod": target.name,
            "server.address": target.host,
            "server.port": target.port,
        }
        with spans.client("upstream attempt", **attributes) as span:
            headers = base_headers.copy()
            spans.inject(span, headers)
            response = await self.attempt(request, ctx, body, headers, verdicts, another_pod)
            if ctx.status is not None:
                span.set_attribute("http.response.status_code", ctx.status)
            if ctx.error is not None:
                spans.failed(span, ctx.error)
            return response

    async def attempt(
        self,
        request: web.Request,
        ctx: RequestContext,
        body: bytes,
        base_headers: CIMultiDict[str],
        verdicts: Verdicts,
        another_pod: Callable[[], bool] = lambda: False,
    ) -> web.StreamResponse | None:
        """One try on ctx.target. Returns None when the pod failed before sending a response,
        or answered a retryable status while another pod may still be tried; the caller moves
        on to the next pod. A status that `verdicts` finds to be the request's own fault is
        relayed as it is, never tried on another pod."""
        target = ctx.target
        hooks = self.hooks
        upstream: UpstreamResponse | None = None
        complete = False
        finished = False  # response_complete ran (a whole answer runs it before sending)
        load = self.load
        ctx.started_at = now = time.monotonic()
        if load.count_tokens:
            load.acquire(ctx.key, target.name, *self.estimate(ctx), now=now, ctx=ctx)
        else:  # nothing reads tokens: no estimate (it walks the prompt)
            load.acquire(ctx.key, target.name, now=now, ctx=ctx)
        try:
            # Inside the try: a client that disconnects while a pre_request hook awaits (a
            # Redis write, say) still gets response_complete, which undoes what the hooks
            # that already ran counted (the reference runs it for any request that failed or
            # was dropped after a pod was scheduled).
            if hooks.pre_request.active:
                await hooks.pre_request.run(ctx)
            headers = base_headers
            if ctx.upstream_headers:
                headers = base_headers.copy()
                headers.update(ctx.upstream_headers)
            try:
                upstream = await self.client.request(
                    request.method,
                    target.url,
                    request.raw_path,
                    body,
                    headers,
                    self.timeouts[ctx.request.stream],
                )
            except RETRYABLE as exc:
                self._attempt_failed(ctx, "connect", exc)
                return None
            ctx.status = upstream.status
            ctx.upstream_response_headers = upstream.headers
            its_own_fault = verdicts.answered(target.name, upstream.status)
            if upstream.status in RETRY_STATUSES and not its_own_fault and another_pod():
                ctx.error = f"status {upstream.status}"
                self._attempt_failed(ctx, str(upstream.status), None)
                return None
            if hooks.response_received.active:
                await hooks.response_received.run(ctx)
            out_headers = client_response_headers(upstream.headers)
            if ctx.response_headers:
                out_headers.update(ctx.response_headers)
            if is_stream(upstream):
                response = await self.answers.stream(request, upstream, ctx, out_headers)
                complete = True
                return response
            try:
                payload = await upstream.read()
            except RETRYABLE as exc:
                self._attempt_failed(ctx, "read", exc)
                return None
            complete = True
            ctx.response_body = payload
            self.answers.whole(ctx, payload)
            if hooks.response_complete.active:  # before the answer is sent: hooks may add headers
                finished = True
                await hooks.response_complete.run(ctx)
                out_headers.update(ctx.response_headers)
            return web.Response(status=upstream.status, body=payload, headers=out_headers)
        except asyncio.CancelledError:
            ctx.error = ctx.error or "client disconnected"
            raise
        finally:
            load.release(ctx.key)
            if upstream is not None:
                if complete and ctx.error is None:
                    upstream.release()
                else:
                    upstream.close()
            if hooks.response_complete.active and not finished:
                await hooks.response_complete.run(ctx)

    def _attempt_failed(self, ctx: RequestContext, stage: str, exc: BaseException | None) -> None:
        if exc is not None:
            ctx.error = f"{stage} failed: {type(exc).__name__}: {exc}"
            self.outliers.failure(ctx.target.name)
        self.metrics.upstream_failures.labels(ctx.target.name, stage).inc()
        log.warning(
            "upstream attempt failed before a response; trying the next pod",
            extra={
                "endpoint": ctx.target.name,
                "error": ctx.error,
                "request_id": ctx.request.request_id,
            },
        )
