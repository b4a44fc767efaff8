"""Loop-local metric families render as prometheus-client would render its own."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from heimdall_proxy.observability.loop import (
    CounterFamily,
    FamiliesCollector,
    GaugeFamily,
    HistogramFamily,
)


def test_exposition() -> None:
    counter = CounterFamily("x_requests", "Requests.", ("pod", "code"))
    gauge = GaugeFamily("x_running", "Running.", ("model",))
    hist = HistogramFamily("x_seconds", "Latency.", buckets=(0.1, 1.0))
    counter.labels("a", "200").inc()
    counter.labels("a", "200").inc(2)
    counter.labels("b", "500").inc()
    gauge.labels("m").inc()
    gauge.labels("m").inc()
    gauge.labels("m").dec()
    h = hist.labels()
    for v in (0.05, 0.1, 0.5, 5.0):
        h.observe(v)
    registry = CollectorRegistry()
    registry.register(FamiliesCollector([counter, gauge, hist]))
    text = generate_latest(registry).decode()
    assert 'x_requests_total{code="200",pod="a"} 3.0' in text
    assert 'x_requests_total{code="500",pod="b"} 1.0' in text
    assert 'x_running{model="m"} 1.0' in text
    # "le" buckets are cumulative and inclusive of the bound
    assert 'x_seconds_bucket{le="0.1"} 2.0' in text
    assert 'x_seconds_bucket{le="1.0"} 3.0' in text
    assert 'x_seconds_bucket{le="+Inf"} 4.0' in text
    assert "x_seconds_count 4.0" in text
    assert registry.get_sample_value("x_seconds_sum") == pytest.approx(5.65)
    assert "# TYPE x_requests_total counter" in text
    assert "# TYPE x_seconds histogram" in text


def test_wrong_label_count_is_an_error() -> None:
    counter = CounterFamily("x", "X.", ("a",))
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("1", "2")
