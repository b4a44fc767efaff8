"""Seed 004's latency-prediction metrics, labelled by model_name and target_model_name.

The TTFT and TPOT histograms (`inference_objective_request_ttft_seconds`,
`..._tpot_seconds`) are the gateway's own (observability.GatewayMetrics); everything else
of the table is here and exported by the producer. The SLO-violation counters are counters
named as the table names them (`..._slo_violation_total`, TYPE counter in the text
exposition) beside the 0/1 gauges of the same stem (`..._slo_violation`): prometheus-client
calls both families `..._slo_violation`, so the plugins' collector tells them apart by type
(observability/metrics.py). `model_name` is the model asked for, `target_model_name` the
model the request was sent as (InferenceRequest.target_model)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from heimdall_proxy.observability.loop import CounterFamily, GaugeFamily, HistogramFamily

_P = "inference_objective_request_"
_LABELS = ("model_name", "target_model_name")
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_ERROR = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
_DURATION = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05)


class LatencyMetrics:
    __slots__ = (
        "predicted_tpot",
        "predicted_tpot_gauge",
        "predicted_ttft",
        "predicted_ttft_gauge",
        "tpot_duration",
        "tpot_duration_gauge",
        "tpot_error",
        "tpot_gauge",
        "tpot_slo",
        "tpot_violation",
        "tpot_violation_total",
        "ttft_duration",
        "ttft_duration_gauge",
        "ttft_error",
        "ttft_gauge",
        "ttft_slo",
        "ttft_violation",
        "ttft_violation_total",
    )

    def __init__(self) -> None:
        def g(name: str, doc: str) -> GaugeFamily:
            return GaugeFamily(_P + name, doc, _LABELS)

        def h(name: str, doc: str, buckets: tuple[float, ...]) -> HistogramFamily:
            return HistogramFamily(_P + name, doc, _LABELS, buckets=buckets)

        self.ttft_gauge = g("ttft_seconds_gauge", "Last observed TTFT in seconds.")
        self.tpot_gauge = g("tpot_seconds_gauge", "Last observed TPOT in seconds.")
        self.predicted_ttft = h(
            "predicted_ttft_seconds", "Predicted TTFT of the chosen pod, seconds.", _LATENCY
        )
        self.predicted_ttft_gauge = g("predicted_ttft_seconds_gauge", "Last predicted TTFT.")
        self.predicted_tpot = h(
            "predicted_tpot_seconds", "Predicted TPOT of the chosen pod, seconds.", _TPOT
        )
        self.predicted_tpot_gauge = g("predicted_tpot_seconds_gauge", "Last predicted TPOT.")
        self.ttft_duration = h(
            "ttft_prediction_duration_seconds",
            "Time to predict TTFT for all candidates of a request, seconds.",
            _DURATION,
        )
        self.ttft_duration_gauge = g(
            "ttft_prediction_duration_seconds_gauge", "Latest TTFT prediction duration."
        )
        self.tpot_duration = h(
            "tpot_prediction_duration_seconds",
            "Time to predict TPOT for all candidates of a request, seconds.",
            _DURATION,
        )
        self.tpot_duration_gauge = g(
            "tpot_prediction_duration_seconds_gauge", "Latest TPOT prediction duration."
        )
        self.ttft_violation = g("ttft_slo_violation", "1 when the last TTFT missed its SLO.")
        self.ttft_violation_total = CounterFamily(
            _P + "ttft_slo_violation", "TTFT SLO violations.", _LABELS
        )
        self.tpot_violation = g("tpot_slo_violation", "1 when the last TPOT missed its SLO.")
        self.tpot_violation_total = CounterFamily(
            _P + "tpot_slo_violation", "TPOT SLO violations.", _LABELS
        )
        self.ttft_slo = g("ttft_slo_threshold_seconds", "TTFT SLO of the last request with one.")
        self.tpot_slo = g("tpot_slo_threshold_seconds", "TPOT SLO of the last request with one.")

        # ours, not seed 004's: |predicted - actual| / actual of the chosen pod, so the
        # predictor's mean absolute percentage error is the histogram's sum / count
        self.ttft_error = HistogramFamily(
            "heimdall_latency_ttft_prediction_error_ratio",
            "Absolute error of the chosen pod's predicted TTFT, relative to the actual one.",
            _LABELS,
            buckets=_ERROR,
        )
        self.tpot_error = HistogramFamily(
            "heimdall_latency_tpot_prediction_error_ratio",
            "Absolute error of the chosen pod's predicted TPOT, relative to the actual one.",
            _LABELS,
            buckets=_ERROR,
        )

    def collect(self) -> Iterator[Metric]:
        for name in self.__slots__:
            family: CounterFamily | GaugeFamily | HistogramFamily = getattr(self, name)
            yield family.collect()
