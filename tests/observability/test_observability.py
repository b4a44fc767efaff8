"""Logging set-up, log formatters and the gateway's Prometheus metrics."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import Metric, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from heimdall_proxy.config.gateway import EndpointConfig
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.log import V4, V5, V
from heimdall_proxy.framework.types import Metrics
from heimdall_proxy.observability.logs import JsonFormatter, TextFormatter, setup_logging
from heimdall_proxy.observability.metrics import GatewayMetrics


@pytest.fixture
def package_logger() -> Iterator[logging.Logger]:
    """setup_logging reconfigures the package logger; put it back for the other tests."""
    logger = logging.getLogger("heimdall_proxy")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield logger
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


def record(level: int, msg: str, *args: object, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("heimdall_proxy.test")
    return logger.makeRecord(logger.name, level, __file__, 1, msg, args, None, extra=extra)


def test_json_formatter_emits_one_object_with_extras() -> None:
    rec = record(logging.WARNING, "picked %s", "pod-a", endpoint="pod-a", scores={"a": 0.5})
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["msg"] == "picked pod-a"
    assert doc["level"] == "warning"
    assert doc["logger"] == "heimdall_proxy.test"
    assert doc["endpoint"] == "pod-a"
    assert doc["scores"] == {"a": 0.5}
    assert doc["ts"] == pytest.approx(rec.created, abs=1e-5)
    # Standard LogRecord attributes are not dumped.
    assert not {"args", "levelno", "pathname", "lineno", "msecs"} & set(doc)


def test_json_formatter_verbosity_level_names_and_unserialisable_values() -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd!"

    doc = json.loads(JsonFormatter().format(record(V4, "Running scorer", thing=Odd())))
    assert doc["level"] == "v4"
    assert doc["thing"] == "odd!"
    assert json.loads(JsonFormatter().format(record(logging.INFO, "x")))["level"] == "info"
    assert json.loads(JsonFormatter().format(record(logging.DEBUG, "x")))["level"] == "debug"


def test_json_formatter_includes_exceptions() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = record(logging.ERROR, "failed")
        rec.exc_info = sys.exc_info()
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["level"] == "error"
    assert "RuntimeError: boom" in doc["exc"]


def test_text_formatter() -> None:
    line = TextFormatter().format(record(V5, "Scores", request_id="r1"))
    assert "   v5 heimdall_proxy.test: Scores request_id=r1" in line


def test_setup_logging_v4(
    package_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging(4)
    assert package_logger.propagate is False
    assert len(package_logger.handlers) == 1
    sched = logging.getLogger("heimdall_proxy.framework.scheduler")
    assert sched.isEnabledFor(V(4))
    assert not sched.isEnabledFor(V(5))
    sched.log(V4, "Running filter", extra={"filter": "by-label"})
    sched.log(V5, "Scores")  # above the verbosity: dropped
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["msg"] == "Running filter"
    assert doc["level"] == "v4"
    assert doc["filter"] == "by-label"
    assert doc["logger"] == "heimdall_proxy.framework.scheduler"


def test_setup_logging_default_is_info_text(
    package_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging(fmt="text")
    setup_logging(0, fmt="text")  # idempotent: still one handler
    assert len(package_logger.handlers) == 1
    log = logging.getLogger("heimdall_proxy.x")
    assert log.isEnabledFor(logging.INFO)
    assert not log.isEnabledFor(V(1))
    log.info("hello", extra={"k": 1})
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "info heimdall_proxy.x: hello k=1" in err


def test_setup_logging_negative_verbosity_is_zero(package_logger: logging.Logger) -> None:
    setup_logging(-3)
    assert package_logger.level == logging.INFO


def make_pool() -> EndpointPool:
    pool = EndpointPool(
        [
            EndpointConfig(name="pod-a", url="http://a:8000"),
            EndpointConfig(name="pod-b", url="http://b:8000"),
        ]
    )
    a, b = pool.endpoints()
    a.metrics = Metrics(waiting=3, running=2, kv_cache_usage=0.25, updated_at=1.0)
    b.metrics = Metrics(waiting=5, running=0, kv_cache_usage=0.75)  # never scraped
    b.healthy = False
    return pool


def test_gateway_metrics_expose_the_pool() -> None:
    metrics = GatewayMetrics(make_pool(), pool_name="mypool")
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE inference_pool_per_pod_queue_size gauge" in text
    assert 'inference_pool_per_pod_queue_size{model_server_pod="pod-a",name="mypool"} 3.0' in text
    assert 'inference_pool_per_pod_queue_size{model_server_pod="pod-b",name="mypool"} 5.0' in text
    get = metrics.registry.get_sample_value
    a = {"name": "mypool", "model_server_pod": "pod-a"}
    b = {"name": "mypool", "model_server_pod": "pod-b"}
    assert get("inference_pool_per_pod_running_requests", a) == 2.0
    assert get("inference_pool_per_pod_kv_cache_utilization", b) == 0.75
    assert get("inference_pool_per_pod_healthy", a) == 1.0
    assert get("inference_pool_per_pod_healthy", b) == 0.0
    age = get("inference_pool_per_pod_metrics_age_seconds", a)
    assert age is not None
    assert age > 0
    assert get("inference_pool_per_pod_metrics_age_seconds", b) is None  # never scraped
    assert get("inference_pool_ready_pods", {"name": "mypool"}) == 1.0
    assert get("inference_pool_average_queue_size", {"name": "mypool"}) == 4.0
    assert get("inference_pool_average_kv_cache_utilization", {"name": "mypool"}) == 0.5
    assert "_created" not in text


def test_pool_gauges_are_read_at_scrape_time() -> None:
    pool = make_pool()
    metrics = GatewayMetrics(pool)
    labels = {"name": "heimdall", "model_server_pod": "pod-a"}
    assert metrics.registry.get_sample_value("inference_pool_per_pod_queue_size", labels) == 3.0
    pool.endpoints()[0].metrics = Metrics(waiting=11)
    assert metrics.registry.get_sample_value("inference_pool_per_pod_queue_size", labels) == 11.0


def test_empty_pool_averages_are_zero() -> None:
    metrics = GatewayMetrics(EndpointPool([]))
    get = metrics.registry.get_sample_value
    assert get("inference_pool_ready_pods", {"name": "heimdall"}) == 0.0
    assert get("inference_pool_average_queue_size", {"name": "heimdall"}) == 0.0


def test_request_metrics_and_plugin_timer() -> None:
    metrics = GatewayMetrics(make_pool())
    other = GatewayMetrics(make_pool())  # each app has its own registry: no clash
    metrics.requests.labels("m", "m", "pod-a", "200").inc()
    metrics.running.labels("m").inc(2)
    observe = metrics.plugin_timer("Scorer", "queue-scorer", "q")
    observe(0.00003)
    observe(0.5)
    get = metrics.registry.get_sample_value
    labels = {"model_name": "m", "target_model_name": "m", "pod": "pod-a", "code": "200"}
    assert get("inference_objective_request_total", labels) == 1.0
    assert get("inference_objective_running_requests", {"model_name": "m"}) == 2.0
    plabels = {"extension_point": "Scorer", "plugin_type": "queue-scorer", "plugin_name": "q"}
    assert get("inference_extension_plugin_duration_seconds_count", plabels) == 2.0
    assert (
        get("inference_extension_plugin_duration_seconds_bucket", {**plabels, "le": "5e-05"}) == 1.0
    )
    assert other.registry.get_sample_value("inference_objective_request_total", labels) is None


class _Source:
    """A plugin with metrics of its own (MetricsSource)."""

    def __init__(self, hits: float, pod: str) -> None:
        self.hits = hits
        self.pod = pod

    def collect_metrics(self) -> Iterator[Metric]:
        yield CounterMetricFamily("demo_hits", "Hits.", value=self.hits)
        per_pod = GaugeMetricFamily("demo_pod_load", "Load.", labels=["pod"])
        per_pod.add_metric([self.pod], 1.0)
        yield per_pod


def test_plugin_metrics_are_exposed_and_same_name_samples_summed() -> None:
    m = GatewayMetrics(EndpointPool([]))
    m.add_sources([_Source(2, "a"), object(), _Source(3, "a"), _Source(1, "b")])
    text = generate_latest(m.registry).decode()
    assert "demo_hits_total 6.0" in text
    assert 'demo_pod_load{pod="a"} 2.0' in text and 'demo_pod_load{pod="b"} 1.0' in text
    assert text.count("# TYPE demo_hits_total counter") == 1
    m.add_sources([object()])  # nothing to expose: nothing registered


def test_breaker_states_and_opens_are_exported() -> None:
    from heimdall_proxy.plugins.requestcontrol.producers.tokenizer import TokenizerPlugin
    from heimdall_proxy.resilience.breaker import CircuitBreaker

    now = [0.0]
    breaker = CircuitBreaker("tok: tokenizer", failures=2, cooldown=5.0, clock=lambda: now[0])

    class _Guarded:  # a plugin guarding one dependency, as TokenizerPlugin does
        def breakers(self) -> list[CircuitBreaker]:
            return [breaker]

    metrics = GatewayMetrics(EndpointPool([]))
    metrics.add_sources([_Guarded()])
    reg = metrics.registry

    def state(s: str) -> float | None:
        labels = {"dependency": "tok: tokenizer", "state": s}
        return reg.get_sample_value("heimdall_dependency_breaker_state", labels)

    assert state("closed") == 1.0 and state("open") == 0.0
    breaker.failure()
    breaker.failure()
    assert state("open") == 1.0
    now[0] = 6.0
    assert state("half-open") == 1.0
    opens = reg.get_sample_value(
        "heimdall_dependency_breaker_opens_total", {"dependency": "tok: tokenizer"}
    )
    assert opens == 1
    assert hasattr(TokenizerPlugin, "breakers")  # the real plugins report theirs


def test_model_series_children_appear_on_first_use_like_labels() -> None:
    """A model's series holds no child until it is used, so the exposition is the same as
    with `labels()` calls: a model never streamed has no TPOT series."""
    metrics = GatewayMetrics(make_pool())
    series = metrics.models.get("m") or metrics.model_series("m")
    assert metrics.models["m"] is series
    text = generate_latest(metrics.registry).decode()
    assert 'inference_objective_running_requests{model_name="m"}' not in text
    (series.running or series.running_child()).inc()
    (series.ttft or series.histogram("ttft")).observe(0.2)
    key = ("pod-a", 200)
    (series.served.get(key) or series.served_child(*key)).inc()
    (series.served.get(key) or series.served_child(*key)).inc()
    get = metrics.registry.get_sample_value
    labels = {"model_name": "m", "target_model_name": "m"}
    assert get("inference_objective_running_requests", {"model_name": "m"}) == 1.0
    assert get("inference_objective_request_ttft_seconds_count", labels) == 1.0
    assert (
        get("inference_objective_request_total", {**labels, "pod": "pod-a", "code": "200"}) == 2.0
    )
    assert get("inference_objective_request_tpot_seconds_count", labels) is None
    assert series.ttft is metrics.ttft.labels("m", "m")
