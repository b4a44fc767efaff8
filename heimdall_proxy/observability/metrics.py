"""Prometheus metrics: the gateway's families, with the Gateway API Inference Extension's names."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Metric, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.plugins import MetricsSource
from heimdall_proxy.framework.scheduler import Observe
from heimdall_proxy.observability.loop import (
    CounterFamily,
    FamiliesCollector,
    GaugeFamily,
    HistogramFamily,
)
from heimdall_proxy.observability.series import ModelSeries
from heimdall_proxy.resilience.breaker import CircuitBreaker, HasBreakers

# The *_created series double the exposition for no use to a dashboard.
disable_created_metrics()  # type: ignore[no-untyped-call]

_LATENCY_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
    15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
_TOKEN_BUCKETS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072,
)  # fmt: skip
_TPOT_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
)  # fmt: skip
_PLUGIN_BUCKETS = (
    0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
    0.05, 0.1,
)  # fmt: skip


class _PoolCollector(Collector):
    """Per-pod gauges read from the pool at scrape time (no bookkeeping on the hot path)."""

    def __init__(self, pool: EndpointPool, pool_name: str) -> None:
        self.pool = pool
        self.pool_name = pool_name

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["name", "model_server_pod"]
        queue = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size", "Waiting requests per pod (vLLM).", labels=labels
        )
        running = GaugeMetricFamily(
            "inference_pool_per_pod_running_requests",
            "Running requests per pod (vLLM).",
            labels=labels,
        )
        kv = GaugeMetricFamily(
            "inference_pool_per_pod_kv_cache_utilization",
            "KV-cache utilization per pod, 0..1 (vLLM).",
            labels=labels,
        )
        healthy = GaugeMetricFamily(
            "inference_pool_per_pod_healthy", "1 when the pod is in rotation.", labels=labels
        )
        age = GaugeMetricFamily(
            "inference_pool_per_pod_metrics_age_seconds",
            "Age of the pod's last metrics scrape.",
            labels=labels,
        )
        endpoints = self.pool.endpoints()
        now = time.monotonic()
        ready = 0
        for e in endpoints:
            lv = [self.pool_name, e.name]
            m = e.metrics
            queue.add_metric(lv, m.waiting)
            running.add_metric(lv, m.running)
            kv.add_metric(lv, m.kv_cache_usage)
            healthy.add_metric(lv, 1.0 if e.healthy else 0.0)
            if m.updated_at:
                age.add_metric(lv, m.age(now))
            ready += e.healthy
        n = len(endpoints) or 1
        yield queue
        yield running
        yield kv
        yield healthy
        yield age
        yield self._pool_gauge("inference_pool_ready_pods", "Pods in rotation.", ready)
        yield self._pool_gauge(
            "inference_pool_average_queue_size",
            "Mean waiting requests per pod.",
            sum(e.metrics.waiting for e in endpoints) / n,
        )
        yield self._pool_gauge(
            "inference_pool_average_kv_cache_utilization",
            "Mean KV-cache utilization over pods.",
            sum(e.metrics.kv_cache_usage for e in endpoints) / n,
        )

    def _pool_gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["name"])
        family.add_metric([self.pool_name], value)
        return family


class _SourcesCollector(Collector):
    """The families of the plugins that export metrics, merged by name and type: samples
    with the same name and labels are summed (two instances of one plugin type add up, as
    they would in one process-wide counter). The type is part of the key: a counter `X_total`
    and a gauge `X` are both family `X` to prometheus-client (seed 004 exports such pairs)."""

    def __init__(self, sources: Iterable[MetricsSource]) -> None:
        self.sources = list(sources)

    def collect(self) -> Iterator[Metric]:
        merged: dict[tuple[str, str], Metric] = {}
        index: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        for source in self.sources:
            for family in source.collect_metrics():
                into = merged.get((family.name, family.type))
                if into is None:
                    into = merged[family.name, family.type] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    at = index.get(key)
                    if at is None:
                        index[key] = len(into.samples)
                        into.samples.append(sample)
                    else:
                        old = into.samples[at]
                        into.samples[at] = old._replace(value=old.value + sample.value)
        yield from merged.values()


class _BreakersCollector(Collector):
    """`heimdall_dependency_breaker_state{dependency,state}` (1 for the state it is in) and
    `heimdall_dependency_breaker_opens_total{dependency}`."""

    STATES = ("closed", "open", "half-open")

    def __init__(self, breakers: list[CircuitBreaker]) -> None:
        self.breakers = breakers

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "heimdall_dependency_breaker_state",
            "Circuit breaker of a request-path dependency: 1 for its current state.",
            labels=["dependency", "state"],
        )
        opens = CounterMetricFamily(
            "heimdall_dependency_breaker_opens",
            "Times a dependency's breaker opened (requests then go on without it).",
            labels=["dependency"],
        )
        for b in self.breakers:
            now = b.state
            for s in self.STATES:
                state.add_metric([b.name, s], 1.0 if s == now else 0.0)
            opens.add_metric([b.name], b.opened)
        yield state
        yield opens


def series_key(model: str, target: str | None = None) -> str:
    """The key of `GatewayMetrics.models` for a model asked for and the model it is sent as:
    the model itself in the usual case (no rewrite)."""
    return model if target is None or target == model else f"{model}\x1f{target}"


class GatewayMetrics:
    """All of the gateway's own metrics, in a registry of their own (one per app). The
    request-path families are loop-local (see loop.py); the pod gauges are read from the
    pool at scrape time."""

    def __init__(self, pool: EndpointPool, pool_name: str = "heimdall") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        model_labels = ("model_name", "target_model_name")
        self.requests = CounterFamily(
            "inference_objective_request",
            "Requests served, by model, serving pod and status code.",
            (*model_labels, "pod", "code"),
        )
        self.errors = CounterFamily(
            "inference_objective_request_error",
            "Requests the gateway failed itself, by error code.",
            (*model_labels, "error_code"),
        )
        self.duration = HistogramFamily(
            "inference_objective_request_duration_seconds",
            "End-to-end request latency as seen by the gateway.",
            model_labels,
            buckets=_LATENCY_BUCKETS,
        )
        self.ttft = HistogramFamily(
            "inference_objective_request_ttft_seconds",
            "Time to the first response byte: of the first streamed event, or of the whole "
            "answer when it is not streamed (as the latency predictor records it).",
            model_labels,
            buckets=_LATENCY_BUCKETS,
        )
        self.tpot = HistogramFamily(
            "inference_objective_request_tpot_seconds",
            "Time per output token after the first, of streamed requests.",
            model_labels,
            buckets=_TPOT_BUCKETS,
        )
        self.input_tokens = HistogramFamily(
            "inference_objective_input_tokens",
            "Prompt tokens per request, from the answer's usage.",
            model_labels,
            buckets=_TOKEN_BUCKETS,
        )
        self.output_tokens = HistogramFamily(
            "inference_objective_output_tokens",
            "Output tokens per request, from the answer's usage (streams without usage: their "
            "events).",
            model_labels,
            buckets=_TOKEN_BUCKETS,
        )
        self.running = GaugeFamily(
            "inference_objective_running_requests",
            "Requests in flight through the gateway.",
            ("model_name",),
        )
        self.upstream_failures = CounterFamily(
            "inference_objective_upstream_failures",
            "Attempts that failed before a response (connect errors, resets); the gateway "
            "retried them on the next pod when it could.",
            ("pod", "reason"),
        )
        self.disagg_hops = CounterFamily(
            "inference_objective_disagg_hops",
            "Encode and prefill hops the gateway sent that succeeded, by stage and pod.",
            ("stage", "pod"),
        )
        self.disagg_hop_failures = CounterFamily(
            "inference_objective_disagg_hop_failures",
            "Encode and prefill hops that failed (connect error, timeout, error status, no "
            "transfer parameters); the request was served without that stage.",
            ("stage", "pod"),
        )
        self.retries = CounterFamily(
            "inference_objective_retries",
            "Attempts sent to the next pod, by why the previous one failed (connect, read, "
            "or its status).",
            ("reason",),
        )
        self.ejections = CounterFamily(
            "inference_objective_pod_ejections",
            "Times a pod was ejected from the candidates for failing (outlierDetection).",
            ("pod",),
        )
        scheduler = HistogramFamily(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Scheduling cycle latency.",
            buckets=_PLUGIN_BUCKETS,
        )
        self.scheduler_duration = scheduler.labels()
        self.plugin_duration = HistogramFamily(
            "inference_extension_plugin_duration_seconds",
            "Per-plugin latency.",
            ("extension_point", "plugin_type", "plugin_name"),
            buckets=_PLUGIN_BUCKETS,
        )
        families: list[CounterFamily | GaugeFamily | HistogramFamily] = [
            self.requests,
            self.errors,
            self.duration,
            self.ttft,
            self.tpot,
            self.input_tokens,
            self.output_tokens,
            self.running,
            self.upstream_failures,
            self.disagg_hops,
            self.disagg_hop_failures,
            self.ejections,
            self.retries,
            scheduler,
            self.plugin_duration,
        ]
        self.registry.register(FamiliesCollector(families))
        #: model label -> its request-path series; read as
        #: `metrics.models.get(model) or metrics.model_series(model)` (series.py)
        self.models: dict[str, ModelSeries] = {}
        self._pool_collector = _PoolCollector(pool, pool_name)
        self.registry.register(self._pool_collector)

    def model_series(self, model: str, target: str | None = None) -> ModelSeries:
        """The series of requests for `model` sent as `target` (default: the same model),
        made on first use; read as `metrics.models.get(series_key(model, target)) or
        metrics.model_series(model, target)`."""
        series = self.models[series_key(model, target)] = ModelSeries(self, model, target)
        return series

    def use_pool(self, pool: EndpointPool) -> None:
        """Read the per-pod gauges from `pool` from now on (a reloaded config's pool)."""
        self._pool_collector.pool = pool

    def add_sources(self, plugins: Iterable[object]) -> list[Collector]:
        """Expose the metrics of the plugins that have their own (MetricsSource), and the
        states of the breakers guarding their dependencies. Returns the collectors added, for
        `remove_sources` when a reload retires these plugins."""
        plugins = list(plugins)
        added: list[Collector] = []
        sources = [p for p in plugins if isinstance(p, MetricsSource)]
        if sources:
            added.append(_SourcesCollector(sources))
        breakers = [b for p in plugins if isinstance(p, HasBreakers) for b in p.breakers()]
        if breakers:
            added.append(_BreakersCollector(breakers))
        for collector in added:
            self.registry.register(collector)
        return added

    def remove_sources(self, collectors: Iterable[Collector]) -> None:
        for collector in collectors:
            self.registry.unregister(collector)

    def plugin_timer(self, point: str, plugin_type: str, plugin_name: str) -> Observe:
        return self.plugin_duration.labels(point, plugin_type, plugin_name).observe
