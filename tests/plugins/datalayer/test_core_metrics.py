"""core-metrics-extractor and metrics-data-source: the gateway's own scrape of the pods'
metrics page, configured by the source, with the extractor's custom metrics published as
endpoint attributes; the standard ones answered from the scrape's snapshot."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp import web

from heimdall_proxy.config.gateway import parse_config
from heimdall_proxy.datalayer.scan import scan_families
from heimdall_proxy.framework.attributes import read_attribute
from heimdall_proxy.plugins.datalayer.core_metrics import (
    CoreMetricsExtractor,
    CoreMetricsParams,
    MetricSpec,
)
from tests.conftest import GatewayFactory, eventually
from tests.helpers import ep
from tests.plugins.datalayer.test_models import build
from tests.plugins.helpers import ledger

PAGE = b"""vllm:num_requests_waiting{model_name="m"} 3
vllm:num_requests_running{model_name="m"} 5
vllm:kv_cache_usage_perc{model_name="m"} 0.25
custom_queue_depth{tier="gold"} 7
custom_queue_depth{tier="silver"} 2
sglang_depth 11
"""


def extractor(params: dict[str, Any]) -> CoreMetricsExtractor:
    return CoreMetricsExtractor("core", CoreMetricsParams.model_validate(params), ledger())


def test_spec_parses_quoted_and_bare_label_values() -> None:
    assert MetricSpec.parse('x{tier=gold, zone="a"}') == MetricSpec(
        "x", (("tier", "gold"), ("zone", "a"))
    )
    assert MetricSpec.parse("vllm:num_requests_waiting") == MetricSpec("vllm:num_requests_waiting")
    with pytest.raises(ValueError, match="not a valid metric specification"):
        MetricSpec.parse("9bad{")


def test_custom_metric_published_per_engine_label() -> None:
    # llm-d's README example: a custom engine's selector with a label matcher
    plugin = extractor(
        {
            "engineConfigs": [
                {
                    "name": "vllm",
                    "customMetrics": [
                        {
                            "attributeKey": "custom.queue_depth",
                            "metricSpec": "custom_queue_depth{tier=gold}",
                        }
                    ],
                },
                {
                    "name": "my-engine",
                    "customMetrics": [
                        {"attributeKey": "custom.queue_depth", "metricSpec": "sglang_depth"}
                    ],
                },
            ]
        }
    )
    assert plugin.metric_families == {"custom_queue_depth", "sglang_depth"}
    found = scan_families(PAGE, plugin.metric_families)
    plain, labelled = ep("a"), ep("b", {"llm-d.ai/engine-type": "my-engine"})
    legacy = ep("c", {"inference.networking.k8s.io/engine-type": "my-engine"})
    for endpoint in (plain, labelled, legacy):
        plugin.extract(endpoint, found)
    assert read_attribute(plain, "custom.queue_depth") == 7.0
    assert read_attribute(labelled, "custom.queue_depth") == 11.0
    assert read_attribute(legacy, "custom.queue_depth") == 11.0
    with pytest.raises(ValueError, match=r"custom\.queue_depth"):
        plugin.extract(plain, {})  # the value published last stays
    assert read_attribute(plain, "custom.queue_depth") == 7.0


def test_standard_attributes_are_the_scrapes_snapshot() -> None:
    endpoint = ep("a", waiting=3, running=5, kv_cache_usage=0.25, updated_at=1.0)
    assert read_attribute(endpoint, "WaitingQueueSize") == 3.0
    assert read_attribute(endpoint, "RunningRequestsSize") == 5.0
    assert read_attribute(endpoint, "KVCacheUsagePercent") == 0.25
    assert read_attribute(ep("never-scraped"), "WaitingQueueSize") is None


def test_unhonoured_engine_specs_and_bad_default_are_said(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        extractor({"engineConfigs": [{"name": "x", "queuedRequestsSpec": "x_queue"}]})
    assert "not honoured" in caplog.text and "['x']" in caplog.text
    with pytest.raises(ValueError, match="defaultEngine 'nope' not found"):
        CoreMetricsParams.model_validate({"defaultEngine": "nope"})
    with pytest.raises(ValueError, match="reserved"):
        CoreMetricsParams.model_validate({"engineConfigs": [{"name": "default"}]})


def _doc(path: str = "/metrics", custom: bool = True) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if custom:
        params = {
            "engineConfigs": [
                {
                    "name": "vllm",
                    "customMetrics": [
                        {"attributeKey": "depth", "metricSpec": "custom_queue_depth{tier=gold}"}
                    ],
                }
            ]
        }
    return {
        "plugins": [
            {"type": "metrics-data-source", "parameters": {"path": path}},
            {"type": "core-metrics-extractor", "parameters": params},
            {"type": "queue-scorer"},
        ],
        "dataLayer": {
            "sources": [
                {
                    "pluginRef": "metrics-data-source",
                    "extractors": [{"pluginRef": "core-metrics-extractor"}],
                }
            ]
        },
    }


def test_metrics_source_is_the_builtin_scrape_not_a_polled_source() -> None:
    pset = build(_doc())
    (wired,) = pset.data_sources
    assert wired.builtin_scrape and wired.name == "metrics-data-source"


async def test_gateway_scrapes_the_sources_path_and_publishes_custom_metrics(
    aiohttp_server: Any, start_gateway: GatewayFactory
) -> None:
    asked: list[str] = []

    async def metrics(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(body=PAGE)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_get("/custom/metrics", metrics)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", models)
    server = await aiohttp_server(app)
    doc = _doc("/custom/metrics")
    doc["endpoints"] = [{"name": "stub", "url": str(server.make_url("")).rstrip("/")}]
    gw = await start_gateway(parse_config(doc, "<test>"))
    endpoint = gw.gateway.pool.get("stub")
    assert endpoint is not None
    await eventually(lambda: read_attribute(endpoint, "depth") == 7.0)
    assert set(asked) == {"/custom/metrics"}
    assert (endpoint.metrics.waiting, endpoint.metrics.running) == (3, 5)
    assert read_attribute(endpoint, "KVCacheUsagePercent") == 0.25


def test_interval_and_inject_defaults_are_warned(caplog: pytest.LogCaptureFixture) -> None:
    doc = _doc(custom=False)
    doc["plugins"][0]["parameters"]["interval"] = "1s"
    doc["dataLayer"]["injectDefaults"] = False
    with caplog.at_level(logging.WARNING):
        build(doc)
    assert "interval is not honoured" in caplog.text
    assert "injectDefaults: false is not honoured" in caplog.text
