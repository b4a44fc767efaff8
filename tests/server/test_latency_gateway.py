"""Latency-predicted scheduling through the gateway, on simulated pods of unequal speed: the
producer trains from the responses, the slow pod gets a larger learned factor and less
traffic; a sheddable request no busy pod can serve within its SLO gets a 429 saying why;
the producer may be listed inside the profile, as in llm-d's example."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayFactory, PodFactory, eventually, make_config

EPP: dict[str, Any] = {
    "plugins": [
        {"type": "predicted-latency-producer", "parameters": {"minSamples": 8}},
        {"type": "slo-headroom-tier-filter"},
        {"type": "latency-scorer"},
        {"type": "latency-slo-admitter"},
        {"type": "weighted-random-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "predicted-latency-producer"},
                {"pluginRef": "slo-headroom-tier-filter"},
                {"pluginRef": "latency-scorer"},
                {"pluginRef": "weighted-random-picker"},
            ],
        }
    ],
    "objectives": [{"name": "batch", "priority": -1}],
}
BODY = {"model": "sim-model", "prompt": "hello there " * 20, "max_tokens": 8}
STREAM = {**BODY, "stream": True}


@pytest.mark.slow
async def test_slow_pod_learned_and_avoided(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    fast = await start_pod(time_scale=0.25)
    slow = await start_pod(time_scale=1.0)
    gw = await start_gateway(make_config([fast, slow], EPP))
    served: Counter[str] = Counter()
    async with aiohttp.ClientSession() as http:
        for i in range(100):
            async with http.post(f"{gw.url}/v1/completions", json=BODY) as r:
                assert r.status == 200
                await r.read()
                if i >= 40:
                    served[r.headers["x-sim-pod"]] += 1
    producer = gw.gateway.plugins.plugins["predicted-latency-producer"]
    factors = producer.predictor.ttft.factors  # type: ignore[attr-defined]
    # 4x slower engine steps; the gateway's own milliseconds (more on a loaded machine)
    # bring the end-to-end ratio below 4
    assert factors[slow.name] / factors[fast.name] > 1.8
    assert served[fast.name] >= 36, served  # of 60; about 50 expected, 30 by chance
    assert gw.metric(
        "inference_objective_request_predicted_ttft_seconds_count",
        {"model_name": "sim-model", "target_model_name": "sim-model"},
    )


async def test_sheddable_request_refused_when_no_pod_meets_its_slo(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(name="a"), await start_pod(name="b")]
    # the saturation detector must not shed first: this is about the SLO admitter
    epp = {**EPP, "saturationDetector": {"queueDepthThreshold": 1000}}
    gw = await start_gateway(make_config(pods, epp))
    async with aiohttp.ClientSession() as http:
        for _ in range(12):  # train past minSamples
            async with http.post(f"{gw.url}/v1/completions", json=BODY) as r:
                await r.read()
        hold = asyncio.Event()
        for p in pods:
            p.pod.hold = hold
        busy = []
        for _ in range(16):  # keep both pods busy (all 16 on one pod: p = 2^-15)
            busy.append(asyncio.create_task(http.post(f"{gw.url}/v1/completions", json=STREAM)))
        producer = gw.gateway.plugins.plugins["predicted-latency-producer"]
        load = producer.load  # type: ignore[attr-defined]
        await eventually(lambda: all(load.requests.get(p.name, 0) > 0 for p in pods))
        slo = {"x-slo-ttft-ms": "0.01", "x-gateway-inference-objective": "batch"}
        async with http.post(f"{gw.url}/v1/completions", json=BODY, headers=slo) as shed:
            assert shed.status == 429
            err = (await shed.json())["error"]
            assert err["code"] == "slo_unattainable"
            assert "x-slo-ttft-ms" in err["message"] and "sheddable" in err["message"]
        kept = asyncio.create_task(
            http.post(f"{gw.url}/v1/completions", json=STREAM, headers={"x-slo-ttft-ms": "0.01"})
        )
        await asyncio.sleep(0.05)
        hold.set()
        for t in [*busy, kept]:
            r = await t
            assert r.status == 200
            await r.read()
            r.release()


async def test_streaming_mode_trains_ttft_and_tpot(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    epp = {
        "plugins": [
            {
                "type": "predicted-latency-producer",
                "parameters": {"streamingMode": True, "minSamples": 4},
            },
            {"type": "latency-scorer"},
        ]
    }
    pods = [await start_pod(), await start_pod()]
    gw = await start_gateway(make_config(pods, epp))
    async with aiohttp.ClientSession() as http:
        for _ in range(6):
            async with http.post(f"{gw.url}/v1/completions", json=STREAM) as r:
                assert r.status == 200
                await r.read()
        async with http.post(f"{gw.url}/v1/completions", json=BODY) as r:  # not streamed
            await r.read()
    predictor = gw.gateway.plugins.plugins["predicted-latency-producer"].predictor  # type: ignore[attr-defined]
    predictor.ttft.flush()
    predictor.tpot.flush()
    # TTFT once per stream; TPOT at token 2 and at the end (samplingMean 1000: no other
    # token of an 8-token stream is sampled)
    assert predictor.ttft.samples == 6 and predictor.tpot.samples == 12
    labels = {"model_name": "sim-model", "target_model_name": "sim-model"}
    assert gw.metric("inference_objective_request_tpot_seconds_gauge", labels)
    assert gw.metric("inference_objective_request_ttft_seconds_gauge", labels)


@pytest.mark.slow
async def test_predicted_latency_scorer_alone_schedules_and_learns(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    epp = {
        "plugins": [
            {"type": "prefix-cache-scorer"},
            {"type": "predicted-latency-scorer", "parameters": {"minSamples": 4}},
        ],
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": "predicted-latency-scorer"}]}
        ],
    }
    pods = [await start_pod(), await start_pod()]
    gw = await start_gateway(make_config(pods, epp))
    slo = {"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "50"}
    async with aiohttp.ClientSession() as http:
        for i in range(12):
            async with http.post(
                f"{gw.url}/v1/completions", json=STREAM, headers=slo if i % 2 else {}
            ) as r:
                assert r.status == 200
                await r.read()
    plugin = gw.gateway.plugins.plugins["predicted-latency-scorer"]
    assert plugin.predictor.ttft.samples >= 8  # type: ignore[attr-defined]
    labels = {"model_name": "sim-model", "target_model_name": "sim-model"}
    assert gw.metric("inference_objective_request_ttft_slo_threshold_seconds", labels) == 0.5
    # requests after the first training batch were predicted, and their error recorded
    assert gw.metric("heimdall_latency_ttft_prediction_error_ratio_count", labels)


async def test_sampling_mean_spaces_the_tpot_samples(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """samplingMean 3: after token 2, a TPOT sample every 3 tokens on average (Poisson
    intervals), up to maxTPOTSamples a stream."""
    params = {"streamingMode": True, "minSamples": 4, "samplingMean": 3, "maxTPOTSamples": 100}
    epp = {"plugins": [{"type": "predicted-latency-producer", "parameters": params}]}
    gw = await start_gateway(make_config([await start_pod()], epp))
    async with aiohttp.ClientSession() as http:
        for _ in range(4):
            body = {**STREAM, "max_tokens": 40, "ignore_eos": True}
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
                await r.read()
    predictor = gw.gateway.plugins.plugins["predicted-latency-producer"].predictor  # type: ignore[attr-defined]
    predictor.tpot.flush()
    # per stream: token 2, about 38 / 3 Poisson-spaced ones, the end: ~14 (2 with the default)
    assert 4 * 8 <= predictor.tpot.samples <= 4 * 22
