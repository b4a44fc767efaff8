"""deploy/prometheus/rules.yaml and deploy/grafana/heimdall-proxy.json against a real
Prometheus scraping a gateway in front of simulated pods: promtool accepts the rules, every
recording rule and every series an alert reads has data, the pod-ejected alert fires when a
pod fails, and every dashboard panel's query returns data. A renamed metric fails here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.conftest import GatewayFactory, PodFactory, RunningGateway, eventually
from tests.deploy.live import ROOT, live_config
from tests.deploy.promserver import RULES, Prometheus, binary, prometheus, selectors
from tests.tokenization.model import make_model_dir

DASHBOARD = ROOT / "deploy" / "grafana" / "heimdall-proxy.json"
MODEL = "sim-model"


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


@pytest.mark.slow
def test_promtool_accepts_the_rules() -> None:
    out = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_rules_and_the_dashboard_name_what_the_other_needs() -> None:
    records = {rule["record"] for rule in rules() if "record" in rule}
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert {
        "HeimdallPodEjected",
        "HeimdallSustainedShedding",
        "HeimdallKVEventsStale",
        "HeimdallScrapeFailing",
        "HeimdallPodMetricsStale",
        "HeimdallSaturationStuck",
    } <= alerts
    queries = panel_queries()
    assert len(queries) >= 15
    used = set().union(*(selectors(expr) for _, expr in queries))
    # every recorded series is drawn somewhere but the alert-only 5m rate
    assert records - used == {"heimdall:flow_control_rejections:rate5m"}
    assert selectors('sum by (le) (rate(x_bucket{a="b"}[1m])) / y offset 5m') == {"x_bucket", "y"}


async def traffic(http: aiohttp.ClientSession, gw: RunningGateway, stop: asyncio.Event) -> None:
    """Streams and plain requests, prompts repeating (prefix hits), until `stop`."""
    i = 0
    while not stop.is_set():
        body = {
            "model": MODEL,
            "prompt": "the gateway routes every request to the pod that serves it best " * 4
            + str(i % 3),
            "max_tokens": 4,
            "stream": i % 2 == 0,
        }
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            await r.read()
        i += 1
        await asyncio.sleep(0.05)


async def check_rules(prom: Prometheus) -> None:
    for rule in rules():
        if "record" in rule:
            await prom.wait_for(rule["record"])
        else:
            for name in selectors(rule["expr"]):
                await prom.wait_for(name)
    for group in (await prom.get("/api/v1/rules"))["groups"]:
        for rule in group["rules"]:
            assert rule["health"] == "ok", rule


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_rules_and_dashboard_against_a_real_prometheus(
    start_pod: PodFactory, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    pods = [await start_pod(kv_events_port=-1) for _ in range(3)]
    gw = await start_gateway(live_config(pods, make_model_dir(tmp_path / "model")))
    jobs = {
        "heimdall-proxy": [f"127.0.0.1:{gw.server.port}"],
        "vllm": [f"127.0.0.1:{p.server.port}" for p in pods],
    }
    async with aiohttp.ClientSession() as http, prometheus(tmp_path, jobs) as prom:
        stop = asyncio.Event()
        background = asyncio.create_task(traffic(http, gw, stop))
        try:
            # a pod that answers 503: ejected after two failures, its requests retried
            bad = pods[0]
            bad.pod.fail_status = 503
            ejections = {"pod": bad.name}
            await eventually(
                lambda: bool(gw.metric("inference_objective_pod_ejections_total", ejections)), 20
            )
            bad.pod.fail_status = None
            # the whole pool saturated: sheddable (batch) requests are refused
            for p in pods:
                p.pod.metrics_override = {"waiting": 50}
            saturated = {"inference_pool": "heimdall"}
            saturation = "inference_extension_flow_control_pool_saturation"
            await eventually(lambda: (gw.metric(saturation, saturated) or 0) >= 1, 20)
            headers = {"x-gateway-inference-objective": "batch"}
            for _ in range(3):
                body = {"model": MODEL, "prompt": "batch", "max_tokens": 1}
                async with http.post(f"{gw.url}/v1/completions", json=body, headers=headers) as r:
                    assert r.status == 429
            for p in pods:
                p.pod.metrics_override = {}

            firing = await prom.wait_for(
                'ALERTS{alertname="HeimdallPodEjected",alertstate="firing"}'
            )
            assert {a["metric"]["pod"] for a in firing} == {bad.name}
            alerts = (await prom.get("/api/v1/alerts"))["alerts"]
            assert any(
                a["labels"]["alertname"] == "HeimdallPodEjected" and a["state"] == "firing"
                for a in alerts
            )

            await check_rules(prom)
            for title, expr in panel_queries():
                result = await prom.wait_for(expr.replace("$__rate_interval", "1m"))
                assert result, title
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await background
