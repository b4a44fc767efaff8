"""Flow control's metrics, under GIE's names: queue size and bytes and the time spent queued
(by fairness id, priority and outcome), the pool's saturation, and rejections by reason."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from heimdall_proxy.observability.loop import (
    CounterFamily,
    FamiliesCollector,
    GaugeFamily,
    HistogramFamily,
)

_WAIT_BUCKETS = (
    *(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
    *(2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)


class FlowMetrics:
    def __init__(self, registry: CollectorRegistry | None, pool_name: str = "heimdall") -> None:
        self.pool_name = pool_name
        flow = ("fairness_id", "priority", "inference_pool")
        self.queue_size = GaugeFamily(
            "inference_extension_flow_control_queue_size",
            "Requests waiting in the gateway's flow-control queues.",
            flow,
        )
        self.queue_bytes = GaugeFamily(
            "inference_extension_flow_control_queue_bytes",
            "Body bytes of the requests waiting in the flow-control queues.",
            flow,
        )
        self.queue_duration = HistogramFamily(
            "inference_extension_flow_control_request_queue_duration_seconds",
            "Time from admission to the outcome (Dispatched, RejectedCapacity, RejectedSaturated,"
            " EvictedTTL, EvictedContextCancelled).",
            (*flow, "outcome"),
            buckets=_WAIT_BUCKETS,
        )
        pool_saturation = GaugeFamily(
            "inference_extension_flow_control_pool_saturation",
            "Saturation of the last pool admission judged (1.0 and above: saturated).",
            ("inference_pool",),
        )
        self.saturation = pool_saturation.labels(pool_name)
        self.rejections = CounterFamily(
            "inference_extension_flow_control_rejections",
            "Requests answered 429 or 503 by admission, by reason (shed: sheddable and the "
            "pool saturated; queue_full; ttl: waited out its budget; no_endpoint).",
            ("priority", "reason", "inference_pool"),
        )
        if registry is not None:
            registry.register(
                FamiliesCollector(
                    [
                        self.queue_size,
                        self.queue_bytes,
                        self.queue_duration,
                        pool_saturation,
                        self.rejections,
                    ]
                )
            )
