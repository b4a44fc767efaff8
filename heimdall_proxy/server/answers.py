"""Relaying one answer to the client: a whole body, or a stream chunk by chunk as bytes
arrive, with the metrics each kind yields (TTFT, TPOT, token counts, the served count)."""

from __future__ import annotations

import logging
import time

from aiohttp import web
from multidict import CIMultiDict

from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import RequestContext, Usage
from heimdall_proxy.observability.metrics import GatewayMetrics, series_key
from heimdall_proxy.observability.series import ModelSeries
from heimdall_proxy.requesthandling.usage import (
    USAGE_ASKED_KEY,
    sse_events,
    strip_usage_events,
)
from heimdall_proxy.resilience.outliers import OutlierDetector
from heimdall_proxy.server.hooks import Hooks
from heimdall_proxy.upstream import UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

#: The pod failed (unreachable, silent, closed the connection, spoke no HTTP). Before the
#: answer's head that is safe to retry on another pod; after it, the stream breaks.
RETRYABLE = (UpstreamError,)
#: Label used for client-supplied model names the pool does not know (bounded cardinality).
UNKNOWN_MODEL = "unknown"


def is_stream(resp: UpstreamResponse) -> bool:
    ctype = resp.headers.get("Content-Type", "")
    return ctype.startswith("text/event-stream") or resp.content_length is None


class Answers:
    def __init__(
        self,
        hooks: Hooks,
        metrics: GatewayMetrics,
        outliers: OutlierDetector,
        load: InFlightLoad | None = None,
    ) -> None:
        self.metrics = metrics
        self.outliers = outliers
        #: The in-flight ledger: a stream's first chunk ends its prompt's share of the load.
        self.load = load or InFlightLoad()
        #: None when no plugin follows chunks: one test per chunk, no call.
        self.streaming = hooks.response_streaming if hooks.response_streaming.active else None

    def whole(self, ctx: RequestContext, payload: bytes) -> None:
        """A whole answer: counted as served and, when it is a success, its arrival is its
        time to first token and its usage counts (left on `ctx` for the hooks)."""
        ctx.first_chunk_at = ctx.last_chunk_at = now = time.monotonic()
        series = self._series(ctx)
        self._served(series, ctx)
        if ctx.status is None or not 200 <= ctx.status < 300:
            return
        (series.ttft or series.histogram("ttft")).observe(now - ctx.request.received_at)
        parser = ctx.request.parser
        if parser is None or (usage := parser.body_usage(payload)) is None:
            return
        ctx.prompt_tokens, ctx.output_tokens, ctx.cached_tokens = prompt, output, _ = usage
        if prompt is not None:
            (series.input_tokens or series.histogram("input_tokens")).observe(prompt)
        if output is not None:
            (series.output_tokens or series.histogram("output_tokens")).observe(output)

    @staticmethod
    def _observe_stream(series: ModelSeries, ctx: RequestContext) -> None:
        """A stream's usage: the pod's when it sent one, else one token per data event."""
        if ctx.output_tokens is None:
            ctx.output_tokens = ctx.events_seen
        if ctx.prompt_tokens is not None:
            (series.input_tokens or series.histogram("input_tokens")).observe(ctx.prompt_tokens)
        output = ctx.output_tokens
        (series.output_tokens or series.histogram("output_tokens")).observe(output)
        if output > 1 and ctx.first_chunk_at:
            tpot = (ctx.last_chunk_at - ctx.first_chunk_at) / (output - 1)
            (series.tpot or series.histogram("tpot")).observe(tpot)

    def _series(self, ctx: RequestContext) -> ModelSeries:
        model = ctx.request.model or UNKNOWN_MODEL
        target = ctx.request.target_model or model
        series = self.metrics.models.get(series_key(model, target))
        return series or self.metrics.model_series(model, target)

    @staticmethod
    def _served(series: ModelSeries, ctx: RequestContext) -> None:
        key = (ctx.target.name, ctx.status)
        (series.served.get(key) or series.served_child(*key)).inc()

    async def stream(
        self,
        request: web.Request,
        upstream: UpstreamResponse,
        ctx: RequestContext,
        headers: CIMultiDict[str],
    ) -> web.StreamResponse:
        """Relay chunk by chunk as bytes arrive."""
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        read = upstream.readany
        streaming = self.streaming
        first = True
        series = self._series(ctx)
        # the answer's usage, as the parser that read the request reads it (None: not read)
        parser = ctx.request.parser if 200 <= upstream.status < 300 else None
        strip = ctx.state.get(USAGE_ASKED_KEY, False)
        chunk_filter = ctx.chunk_filter
        while True:
            try:
                chunk = await read()
            except RETRYABLE as exc:
                ctx.error = f"upstream failed mid-stream: {type(exc).__name__}: {exc}"
                self.outliers.failure(ctx.target.name)
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
            # read once here for every reader: the metrics, the ledger and the hooks
            ctx.chunk_arrived(sse_events(chunk), time.monotonic())
            if parser is not None and (usage := parser.chunk_usage(chunk)) is not None:
                _note_usage(ctx, usage)
            if strip:
                chunk = strip_usage_events(chunk)
            out = chunk if chunk_filter is None else await chunk_filter(chunk)
            if not out:
                if streaming is not None:
                    await streaming.run(ctx, chunk)
                continue
            try:
                await response.write(out)
            except ConnectionError:
                ctx.error = "client disconnected"
                return response
            if first:  # the client's first token (a chunk filter may hold the pod's back)
                first = False
                self.load.prompt_done(ctx.key, ctx.first_chunk_at)
                (series.ttft or series.histogram("ttft")).observe(
                    time.monotonic() - ctx.request.received_at
                )
            if streaming is not None:
                await streaming.run(ctx, chunk)
        try:
            if chunk_filter is not None and (rest := await chunk_filter(b"")):
                await response.write(rest)
        except ConnectionError:
            ctx.error = "client disconnected"
            return response
        self._served(series, ctx)
        if parser is not None:
            self._observe_stream(series, ctx)
        try:
            await response.write_eof()
        except ConnectionError:
            ctx.error = "client disconnected"
        return response


def _note_usage(ctx: RequestContext, usage: Usage) -> None:
    """What a chunk said of the usage; what it left out stays as earlier chunks said
    (Anthropic streams tell the prompt first and the output at the end)."""
    prompt, output, cached = usage
    if prompt is not None:
        ctx.prompt_tokens = prompt
    if output is not None:
        ctx.output_tokens = output
    if cached is not None:
        ctx.cached_tokens = cached
