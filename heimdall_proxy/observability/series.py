"""The request-path series of one model label, looked up once per request instead of once
per metric.

Every request records under its model's label: the running gauge, the duration, the time to
first token, the token counts, the served counter by pod and status. Each `labels()` lookup
is a Python call (a request made six); here the request's `ModelSeries` is one dict lookup
(a C call) and each child a plain attribute. A child is created on its first use through
the family's own `labels()`, exactly when a `labels()` call would have created it, so the
exposition (which series exist, and when they appear) is unchanged."""

from __future__ import annotations

from typing import Literal, Protocol

from heimdall_proxy.observability.loop import (
    CounterChild,
    CounterFamily,
    GaugeChild,
    GaugeFamily,
    HistogramChild,
    HistogramFamily,
)


class ModelFamilies(Protocol):
    """The per-model families a ModelSeries takes its children from (GatewayMetrics's;
    declared here so that the two modules do not import each other)."""

    requests: CounterFamily
    running: GaugeFamily
    duration: HistogramFamily
    ttft: HistogramFamily
    tpot: HistogramFamily
    input_tokens: HistogramFamily
    output_tokens: HistogramFamily


Histogram = Literal["duration", "ttft", "tpot", "input_tokens", "output_tokens"]


class ModelSeries:
    """Children of the per-model families for one model label, None until first used: read
    one as `series.ttft or series.histogram("ttft")`."""

    __slots__ = (
        "_metrics",
        "duration",
        "input_tokens",
        "model",
        "output_tokens",
        "running",
        "served",
        "target",
        "tpot",
        "ttft",
    )

    def __init__(self, metrics: ModelFamilies, model: str, target: str | None = None) -> None:
        self._metrics = metrics
        self.model = model
        #: The model the requests are sent as (`target_model_name`): the same unless rewritten.
        self.target = target or model
        self.running: GaugeChild | None = None
        self.duration: HistogramChild | None = None
        self.ttft: HistogramChild | None = None
        self.tpot: HistogramChild | None = None
        self.input_tokens: HistogramChild | None = None
        self.output_tokens: HistogramChild | None = None
        #: (pod, status code) -> the served counter; read as
        #: `series.served.get((pod, status)) or series.served_child(pod, status)`
        self.served: dict[tuple[str, int | None], CounterChild] = {}

    def running_child(self) -> GaugeChild:
        child = self.running = self._metrics.running.labels(self.model)
        return child

    def histogram(self, name: Histogram) -> HistogramChild:
        family = getattr(self._metrics, name)
        child: HistogramChild = family.labels(self.model, self.target)
        setattr(self, name, child)
        return child

    def served_child(self, pod: str, status: int | None) -> CounterChild:
        child = self.served[pod, status] = self._metrics.requests.labels(
            self.model, self.target, pod, str(status)
        )
        return child
