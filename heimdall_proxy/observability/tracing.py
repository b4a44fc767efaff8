"""OpenTelemetry tracing of the request path (the optional `otel` extra).

One SERVER span per inference request, named after its route (`POST /v1/chat/completions`),
a child of the client's W3C `traceparent` when it sent one; under it, spans for `parse`,
`prepare`, each scheduling profile (`schedule <profile>`), each disaggregation hop
(`hop encode`, `hop prefill`) and each upstream attempt (`upstream attempt`, one per pod
tried). Every request sent to a pod carries a `traceparent` naming the span of that hop or
attempt, so the pod's own spans join the trace.

Off unless asked for: `--otel`, or the standard environment (`OTEL_TRACES_EXPORTER` other
than `none`, or an `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
`OTEL_SDK_DISABLED=true` wins over both. Off, the gateway holds no Tracing and the request
path only tests `is None`; the OpenTelemetry packages are not even imported. Exporter,
endpoint, headers, sampler and resource follow the standard OTEL_* variables (the SDK reads
them); the service name defaults to `heimdall-proxy`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from heimdall_proxy.config.gateway import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

SERVICE_NAME = "heimdall-proxy"
_ENV_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class TracingUnavailable(ConfigError):
    """Tracing was asked for but the `otel` extra is not installed (a config error: the
    process exits before binding a port)."""


def wanted(flag: bool, env: Mapping[str, str] | None = None) -> bool:
    """Whether tracing is on: the CLI flag or the standard OTEL_* environment."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if flag:
        return True
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return any(env.get(name) for name in _ENV_ENDPOINTS)


def configure(flag: bool, env: Mapping[str, str] | None = None) -> Tracing | None:
    """The Tracing the environment and `--otel` ask for, or None. Raises TracingUnavailable
    when `--otel` was given without the extra installed; when only the environment asks,
    that is logged and tracing stays off."""
    if not wanted(flag, env):
        return None
    env = os.environ if env is None else env
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        message = (
            "OpenTelemetry tracing was asked for but its packages are missing: "
            "pip install 'heimdall-proxy[otel]'"
        )
        if flag:
            raise TracingUnavailable(message) from exc
        log.warning("%s; tracing stays off", message)
        return None
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    attributes = {} if named else {"service.name": SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(attributes))
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    for name in filter(None, names):
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError as exc:
                raise TracingUnavailable(
                    "OTLP export needs opentelemetry-exporter-otlp-proto-http: "
                    "pip install 'heimdall-proxy[otel]'"
                ) from exc
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name != "none":
            log.warning("OTEL_TRACES_EXPORTER %r is not supported (otlp, console); ignored", name)
    return Tracing(provider)


class Tracing:
    """Makes the spans of each request from one tracer provider."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("heimdall_proxy")
        self.propagator = TraceContextTextMapPropagator()

    def request(self, method: str, route: str, headers: Mapping[str, str]) -> RequestTrace:
        """Start the SERVER span of one request, under the client's traceparent if any."""
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract(headers)
        span = self.tracer.start_span(
            f"{method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": route},
        )
        return RequestTrace(self, span)

    def shutdown(self) -> None:
        """Export what is buffered and stop (at gateway shutdown)."""
        self.provider.shutdown()


class RequestTrace:
    """The spans of one request: the framework's RequestSpans, plus what the server needs."""

    __slots__ = ("span", "tracing")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self.tracing = tracing
        self.span = span

    def phase(self, name: str, **attributes: Any) -> AbstractContextManager[Span]:
        return self._child(name, attributes)

    def client(self, name: str, **attributes: Any) -> AbstractContextManager[Span]:
        """A CLIENT span for a request to a pod; `inject` its context into that request."""
        from opentelemetry.trace import SpanKind

        return self._child(name, attributes, SpanKind.CLIENT)

    @contextmanager
    def _child(self, name: str, attributes: dict[str, Any], kind: Any = None) -> Iterator[Span]:
        from opentelemetry.trace import SpanKind, set_span_in_context, use_span

        span = self.tracing.tracer.start_span(
            name,
            context=set_span_in_context(self.span),
            kind=kind if kind is not None else SpanKind.INTERNAL,
            attributes=attributes,
        )
        with use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
            yield span

    def inject(self, span: Span, headers: MutableMapping[str, str]) -> None:
        """Write `span`'s W3C traceparent (and tracestate) into `headers`."""
        from opentelemetry.trace import set_span_in_context

        self.tracing.propagator.inject(headers, context=set_span_in_context(span))

    def failed(self, span: Span, error: str) -> None:
        """Mark `span` as failed (a pod that could not be reached, a broken stream)."""
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))

    def end(self, status: int | None, error: str | None = None) -> None:
        """End the request's span with the HTTP status the client got."""
        from opentelemetry.trace import Status, StatusCode

        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
            if status >= 500:
                self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()
