"""OpenTelemetry tracing (observability/tracing.py) on simulated pods over real sockets. The spans go
to the SDK's in-memory exporter instead of an OTLP collector (none runs here); everything
else is real: the pods record the traceparent they received, which must name the span of
that exact hop or attempt."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from heimdall_proxy.observability.tracing import Tracing, TracingUnavailable, configure, wanted
from tests.conftest import (
    GatewayFactory,
    PodFactory,
    RunningGateway,
    RunningPod,
    eventually,
    make_config,
)
from tests.server.test_disagg import LONG, canonical, chat, headers_of, pd_pods

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"

RECOMMENDED_LIKE = {
    "plugins": [
        {"type": "prefix-cache-scorer"},
        {"type": "outstanding-work-scorer"},
        {"type": "max-score-picker"},
    ],
}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    yield exp
    exp.shutdown()


def traced(gw: RunningGateway, exporter: InMemorySpanExporter) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gw.gateway.tracing = Tracing(provider)


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def traceparent(pod: RunningPod) -> list[tuple[str, str]]:
    """(trace id, parent span id) of every traceparent the pod received."""
    out = []
    for headers in headers_of(pod):
        value = headers.get("traceparent")
        if value is not None:
            _version, trace_id, span_id, _flags = value.split("-")
            out.append((trace_id, span_id))
    return out


def ids(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


async def test_request_span_children_and_the_pod_gets_the_attempts_traceparent(
    start_pod: PodFactory, start_gateway: GatewayFactory, exporter: InMemorySpanExporter
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod], RECOMMENDED_LIKE))
    traced(gw, exporter)
    client_parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    status, _, body = await chat(gw, "hello", max_tokens=3, headers={"traceparent": client_parent})
    assert status == 200, body

    spans = exporter.get_finished_spans()
    [root] = by_name(spans, "POST /v1/chat/completions")
    # the client's trace continues: same trace id, the client's span as parent
    assert ids(root)[0] == CLIENT_TRACE
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CLIENT_SPAN
    assert root.attributes is not None and root.attributes["http.response.status_code"] == 200
    children: dict[str, ReadableSpan] = {}
    for name in ("parse", "prepare", "schedule default", "upstream attempt"):
        [span] = by_name(spans, name)
        assert span.parent is not None and span.parent.span_id == root.context.span_id, name
        children[name] = span
    attempt = children["upstream attempt"]
    assert attempt.attributes is not None
    assert attempt.attributes["heimdall.pod"] == pod.name
    assert attempt.attributes["http.response.status_code"] == 200
    assert children["schedule default"].attributes == {
        "heimdall.profile": "default",
        "heimdall.picked": (pod.name,),
    }
    # what the pod received names the attempt's span, not the client's nor the request's
    assert traceparent(pod) == [ids(attempt)]


async def test_each_disaggregation_hop_has_its_span_and_traceparent(
    start_pod: PodFactory, start_gateway: GatewayFactory, exporter: InMemorySpanExporter
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical()))
    traced(gw, exporter)
    status, _, body = await chat(gw, LONG, max_tokens=3)
    assert status == 200, body

    spans = exporter.get_finished_spans()
    [root] = by_name(spans, "POST /v1/chat/completions")
    [hop] = by_name(spans, "hop prefill")
    [attempt] = by_name(spans, "upstream attempt")
    assert {s.name for s in spans} >= {"schedule prefill", "schedule decode"}
    for span in (hop, attempt):
        assert span.parent is not None and span.parent.span_id == root.context.span_id
    assert hop.attributes is not None and hop.attributes["heimdall.pod"] == "prefill-0"
    assert traceparent(prefill) == [ids(hop)]
    assert traceparent(decode) == [ids(attempt)]


async def test_a_failed_attempt_is_its_own_span_and_the_retry_another(
    start_pod: PodFactory, start_gateway: GatewayFactory, exporter: InMemorySpanExporter
) -> None:
    """A pod answering 503 is retried on the other pod: two attempt spans, the first marked
    failed, each pod receiving its own attempt's traceparent."""
    bad, good = await start_pod(), await start_pod()
    bad.pod.fail_status = 503
    good.pod.metrics_override = {"waiting": 10}  # the scheduler prefers the bad pod
    gw = await start_gateway(make_config([bad, good]))
    await eventually(lambda: gw.gateway.pool.get(good.name).metrics.waiting == 10)
    traced(gw, exporter)
    status, _, body = await chat(gw, "hello", max_tokens=2)
    assert status == 200, body
    first, second = sorted(
        by_name(exporter.get_finished_spans(), "upstream attempt"),
        key=lambda s: s.attributes["heimdall.attempt"] if s.attributes else -1,
    )
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["heimdall.pod"], second.attributes["heimdall.pod"]) == (
        bad.name,
        good.name,
    )
    assert first.attributes["http.response.status_code"] == 503
    assert first.status.status_code is StatusCode.ERROR
    assert second.attributes["http.response.status_code"] == 200
    assert traceparent(bad) == [ids(first)]
    assert traceparent(good) == [ids(second)]


def test_off_by_default_and_on_by_flag_or_environment() -> None:
    assert not wanted(False, {})
    assert wanted(True, {})
    assert wanted(False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted(False, {"OTEL_TRACES_EXPORTER": "console"})
    assert not wanted(False, {"OTEL_TRACES_EXPORTER": "none"})
    assert not wanted(True, {"OTEL_SDK_DISABLED": "true"})
    assert configure(False, {}) is None


def test_configured_from_the_environment() -> None:
    tracing = configure(False, {"OTEL_TRACES_EXPORTER": "console"})
    assert tracing is not None
    assert tracing.provider.resource.attributes["service.name"] == "heimdall-proxy"
    tracing.shutdown()


def test_the_operators_service_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    # the SDK's resource reads the process environment itself
    monkeypatch.setenv("OTEL_SERVICE_NAME", "edge-router")
    tracing = configure(True, {"OTEL_SERVICE_NAME": "edge-router", "OTEL_TRACES_EXPORTER": "none"})
    assert tracing is not None
    assert tracing.provider.resource.attributes["service.name"] == "edge-router"
    tracing.shutdown()


def test_flag_without_the_packages_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulates a missing `otel` extra (it is installed here) by hiding the SDK module."""
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(TracingUnavailable, match=r"heimdall-proxy\[otel\]"):
        configure(True, {})
    assert configure(False, {"OTEL_TRACES_EXPORTER": "console"}) is None  # env only: warned
