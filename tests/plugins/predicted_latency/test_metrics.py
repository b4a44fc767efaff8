"""Seed 004's sixteen latency metric families, each exported through a gateway with its
labels (model_name, target_model_name) and type: the two `*_slo_violation_total` are
counters beside the 0/1 `*_slo_violation` gauges; target_model_name is the model the request
is sent as."""

from __future__ import annotations

import aiohttp

from heimdall_proxy.plugins.predicted_latency.metrics import LatencyMetrics
from tests.conftest import GatewayFactory, PodFactory, make_config
from tests.plugins.helpers import req

P = "inference_objective_request_"
#: Seed 004's table: family -> its Prometheus type.
FAMILIES = {
    "ttft_seconds": "histogram",
    "ttft_seconds_gauge": "gauge",
    "predicted_ttft_seconds": "histogram",
    "predicted_ttft_seconds_gauge": "gauge",
    "ttft_prediction_duration_seconds": "histogram",
    "ttft_prediction_duration_seconds_gauge": "gauge",
    "tpot_seconds": "histogram",
    "tpot_seconds_gauge": "gauge",
    "predicted_tpot_seconds": "histogram",
    "predicted_tpot_seconds_gauge": "gauge",
    "tpot_prediction_duration_seconds": "histogram",
    "tpot_prediction_duration_seconds_gauge": "gauge",
    "ttft_slo_violation": "gauge",
    "ttft_slo_violation_total": "counter",
    "tpot_slo_violation": "gauge",
    "tpot_slo_violation_total": "counter",
}
LABELS = {"model_name": "sim-model", "target_model_name": "sim-model"}


def test_the_table_has_sixteen_families() -> None:
    assert len(FAMILIES) == 16


async def test_every_family_is_exported_with_its_type_and_labels(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    epp = {
        "plugins": [
            {
                "type": "predicted-latency-producer",
                "parameters": {"streamingMode": True, "minSamples": 2},
            },
            {"type": "latency-scorer"},
        ]
    }
    gw = await start_gateway(make_config([await start_pod(), await start_pod()], epp))
    # SLOs no answer can meet: every request violates both
    slo = {"x-slo-ttft-ms": "0.001", "x-slo-tpot-ms": "0.001"}
    body = {"model": "sim-model", "prompt": "hello " * 20, "max_tokens": 6, "stream": True}
    predictor = gw.gateway.plugins.plugins["predicted-latency-producer"].predictor  # type: ignore[attr-defined]
    async with aiohttp.ClientSession() as http:
        for i in range(8):
            if i == 4:  # trained past minSamples: the next requests are predicted
                predictor.ttft.flush()
                predictor.tpot.flush()
            async with http.post(f"{gw.url}/v1/completions", json=body, headers=slo) as r:
                assert r.status == 200
                await r.read()
        async with http.get(f"{gw.url}/metrics") as r:
            text = await r.text()
    for family, kind in FAMILIES.items():
        name = P + family
        assert f"# TYPE {name} {kind}\n" in text, name
        sample = name + ("_count" if kind == "histogram" else "")
        value = gw.metric(sample, LABELS)
        assert value is not None and value >= 0, sample
    for which in ("ttft", "tpot"):
        assert gw.metric(f"{P}{which}_slo_violation", LABELS) == 1.0
        total = gw.metric(f"{P}{which}_slo_violation_total", LABELS)
        assert total is not None and total >= 1.0


def test_target_model_is_the_model_the_request_is_sent_as() -> None:
    r = req("completions", model="alias")
    assert r.target_model == "alias"
    r.data["model"] = "served-model"  # a plugin rewrote the body's model
    assert (r.model, r.target_model) == ("alias", "served-model")


def test_violation_counters_are_counters() -> None:
    m = LatencyMetrics()
    m.ttft_violation_total.labels("a", "b").inc()
    family = m.ttft_violation_total.collect()
    assert family.type == "counter"
    assert [s.name for s in family.samples] == [P + "ttft_slo_violation_total"]
