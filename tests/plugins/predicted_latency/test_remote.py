"""The client of GIE's latency-predictor sidecars, against a small real HTTP server that
implements their API in this test (`POST /predict/bulk/strict` on the prediction server,
`POST /add_training_data_bulk` on the training server): predictions come from it while it
answers, the gateway falls back to its in-process model when it is down, and what the
gateway observes reaches the training server."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from heimdall_proxy.config.build import instantiate
from heimdall_proxy.config.gateway import PluginConfig
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.predicted_latency.remote import (
    PredictorUnavailable,
    RemotePredictor,
    prediction_request,
)
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config


class Sidecars:
    """The two servers' routes in one app: TTFT 5 s + 100 ms per waiting request (far above
    what a simulated pod takes, so its predictions are told from the in-process model's),
    TPOT 10 ms + 1 ms per running one; training entries are kept."""

    def __init__(self) -> None:
        self.predict_calls: list[list[dict[str, Any]]] = []
        self.entries: list[dict[str, Any]] = []
        self.fail = False
        self.short = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/predict/bulk/strict", self.predict)
        app.router.add_post("/add_training_data_bulk", self.train)
        return app

    async def predict(self, request: web.Request) -> web.Response:
        if self.fail:
            return web.json_response({"detail": "model not ready"}, status=503)
        reqs = (await request.json())["requests"]
        self.predict_calls.append(reqs)
        preds = [
            {
                "ttft_ms": 5000.0 + 100.0 * r["num_request_waiting"],
                "tpot_ms": 10.0 + r["num_request_running"],
                "predicted_at": "2026-11-25T00:00:00Z",
                "model_type": "bayesian_ridge",
                "quantile": 0.9,
                "last_model_load": None,
            }
            for r in reqs
        ]
        if self.short:
            preds = preds[:-1]
        return web.json_response(
            {
                "predictions": preds,
                "total_requests": len(reqs),
                "successful_predictions": len(preds),
                "failed_predictions": 0,
                "processing_time_ms": 0.1,
            }
        )

    async def train(self, request: web.Request) -> web.Response:
        entries = (await request.json())["entries"]
        self.entries.extend(entries)
        return web.json_response({"message": f"Accepted {len(entries)}"}, status=202)


async def test_client_predicts_marks_a_failing_server_down_and_buffers_training(
    aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sidecars = Sidecars()
    server = await aiohttp_server(sidecars.app())
    url = str(server.make_url("")).rstrip("/")
    client = RemotePredictor(url, url, retry_after=60.0, flush_interval=3600.0)
    await client.start()
    try:
        reqs = [prediction_request(0.5, 300, 2, 4, 0.0), prediction_request(0.1, 300, 0, 1, 1.0)]
        got = await client.predict(reqs)
        assert [t for t, _ in got] == pytest.approx([5.2, 5.0])
        assert [tp for _, tp in got] == pytest.approx([0.014, 0.011])
        assert sidecars.predict_calls[0][1]["prefix_cache_score"] == 1.0
        sidecars.short = True  # one prediction missing: strict means unusable
        with caplog.at_level(logging.WARNING), pytest.raises(PredictorUnavailable):
            await client.predict(reqs)
        assert "in-process model" in caplog.text
        assert not client.available  # no call (and no timeout) until retry_after has passed
        with pytest.raises(PredictorUnavailable):
            await client.predict(reqs)
        assert len(sidecars.predict_calls) == 2
        client.train({"actual_ttft_ms": 120.0, **reqs[0]})
        await client.flush()
        assert client.sent == 1 and sidecars.entries[0]["actual_ttft_ms"] == 120.0
    finally:
        await client.stop()


async def test_a_training_url_the_client_cannot_use_keeps_the_entries() -> None:
    """A port that is not a number passes the config's scheme check; flushing to it fails
    like an unreachable server (entries kept for the next flush), and `stop` still closes."""
    client = RemotePredictor(None, "http://127.0.0.1:notaport", flush_interval=3600.0)
    await client.start()
    client.train({"actual_ttft_ms": 1.0})
    await client.flush()
    assert client.sent == 0
    await client.stop()
    assert client._client is None  # white-box: closed despite the failed last flush


EPP: dict[str, Any] = {
    "plugins": [
        {"type": "prefix-cache-scorer"},
        {
            "type": "predicted-latency-producer",
            "parameters": {"streamingMode": True, "minSamples": 4, "predictorTimeout": "2s"},
        },
        {"type": "latency-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "predicted-latency-producer"},
                {"pluginRef": "latency-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}
STREAM = {"model": "sim-model", "prompt": "hello there " * 20, "max_tokens": 6, "stream": True}


@pytest.mark.slow
async def test_gateway_uses_the_remote_predictor_and_falls_back_when_it_is_down(
    aiohttp_server: Any, start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    sidecars = Sidecars()
    server = await aiohttp_server(sidecars.app())
    url = str(server.make_url("")).rstrip("/")
    epp = {**EPP, "plugins": [dict(p) for p in EPP["plugins"]]}
    epp["plugins"][1]["parameters"] = {
        **epp["plugins"][1]["parameters"],
        "predictionServerURL": url,
        "trainingServerURL": url,
    }
    pods = [await start_pod(), await start_pod()]
    gw = await start_gateway(make_config(pods, epp))
    producer: Any = gw.gateway.plugins.plugins["predicted-latency-producer"]
    async with aiohttp.ClientSession() as http:
        for _ in range(6):
            async with http.post(f"{gw.url}/v1/completions", json=STREAM) as r:
                assert r.status == 200
                await r.read()
        # one bulk call per request, one row per candidate, GIE's field names
        assert len(sidecars.predict_calls) == 6
        assert all(len(c) == 2 for c in sidecars.predict_calls)
        assert set(sidecars.predict_calls[0][0]) == {
            "kv_cache_percentage",
            "input_token_length",
            "num_request_waiting",
            "num_request_running",
            "num_tokens_generated",
            "prefix_cache_score",
        }
        # the remote's predictions were the ones used: its TTFT (>= 5 s) was recorded as
        # the prediction of the chosen pod
        labels = {"model_name": "sim-model", "target_model_name": "sim-model"}
        assert gw.metric("inference_objective_request_predicted_ttft_seconds_gauge", labels) >= 5
        # TTFT and TPOT observations reach the training server (flushed once a second)
        await eventually(
            lambda: (
                any(e["actual_ttft_ms"] > 0 for e in sidecars.entries)
                and any(e["actual_tpot_ms"] > 0 for e in sidecars.entries)
            ),
            within=5.0,
        )
        sidecars.fail = True  # the prediction server goes down
        for _ in range(6):
            async with http.post(f"{gw.url}/v1/completions", json=STREAM) as r:
                assert r.status == 200
                await r.read()
        assert len(sidecars.predict_calls) == 6
        assert not producer.remote.available
        # the in-process model learned all along, so it predicts in the meantime
        assert producer.predictor.ttft.ready
        assert gw.metric("inference_objective_request_predicted_ttft_seconds_gauge", labels) < 5


def test_a_url_without_scheme_is_a_config_error() -> None:
    config = PluginConfig(
        type="predicted-latency-producer", parameters={"predictionServerURL": "localhost:8001"}
    )
    with pytest.raises(Exception, match="predictionServerURL"):
        instantiate(load_builtin_plugins(), config, PluginHandle(pool=None))  # type: ignore[arg-type]
