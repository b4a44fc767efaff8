"""dcgm-data-source and dcgm-extractor: a DCGM exporter's page read with the data layer's own
scrape, the pod's GPU utilization published as the endpoint attribute
("GPUUtilization", "dcgm-extractor") that endpoint-attribute readers find."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from heimdall_proxy.config.gateway import ConfigError, parse_config
from heimdall_proxy.datalayer.scan import scan_families
from heimdall_proxy.framework.attributes import read_attribute
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.plugins.datalayer.dcgm_extractor import DcgmExtractor
from heimdall_proxy.plugins.datalayer.dcgm_source import DcgmDataSource, DcgmSourceParams
from tests.conftest import GatewayFactory, PodFactory, eventually
from tests.helpers import ep
from tests.plugins.datalayer.test_models import build
from tests.plugins.helpers import ledger

SIDECAR_PAGE = b"""# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a"} 35
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b"} 80
DCGM_FI_DEV_FB_USED{gpu="0"} 1000
"""
#: A DaemonSet exporter's page (DCGM_EXPORTER_KUBERNETES=true): samples of several pods.
NODE_PAGE = b"""DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="vllm-a"} 20
DCGM_FI_DEV_GPU_UTIL{gpu="1",pod="vllm-a"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="2",pod="vllm-b"} 90
"""
FAMILIES = frozenset({"DCGM_FI_DEV_GPU_UTIL"})


def extract(page: bytes, pod: str = "vllm-a") -> Any:
    endpoint = ep(pod)
    DcgmExtractor("dcgm-extractor", NoParams(), ledger()).extract(
        endpoint, scan_families(page, FAMILIES)
    )
    return endpoint


def test_sidecar_page_gives_the_busiest_gpu_in_0_1() -> None:
    endpoint = extract(SIDECAR_PAGE)
    assert read_attribute(endpoint, "GPUUtilization", "dcgm-extractor") == 0.8


def test_node_page_counts_only_the_pods_own_samples() -> None:
    assert read_attribute(extract(NODE_PAGE, "vllm-a"), "GPUUtilization", "dcgm-extractor") == 0.4
    assert read_attribute(extract(NODE_PAGE, "vllm-b"), "GPUUtilization", "dcgm-extractor") == 0.9


def test_missing_family_or_pod_fails_and_keeps_the_last_value() -> None:
    endpoint = extract(SIDECAR_PAGE, "vllm-c")
    plugin = DcgmExtractor("dcgm-extractor", NoParams(), ledger())
    with pytest.raises(ValueError, match="not found"):
        plugin.extract(endpoint, scan_families(b"other_metric 1\n", FAMILIES))
    with pytest.raises(ValueError, match="no sample of pod"):
        plugin.extract(endpoint, scan_families(NODE_PAGE, FAMILIES))  # other pods' samples
    assert read_attribute(endpoint, "GPUUtilization", "dcgm-extractor") == 0.8
    # not published under another producer, nor as a core metric
    assert read_attribute(endpoint, "GPUUtilization") is None


def test_source_defaults_and_url() -> None:
    params = DcgmSourceParams()
    assert (params.scheme, params.path, params.port, params.insecure_skip_verify) == (
        "http",
        "/metrics",
        9400,
        True,
    )
    source = DcgmDataSource("dcgm", DcgmSourceParams.model_validate({"interval": "1s"}), ledger())
    assert source.url(ep("p", host="10.0.0.7", port=8000)) == "http://10.0.0.7:9400/metrics"
    assert source.interval == 1.0


def test_node_address_is_refused_saying_why() -> None:
    with pytest.raises(ValueError, match=r"carry no node address.*sidecar"):
        DcgmSourceParams.model_validate({"useNodeAddress": True})


def _gpu_doc(port: int) -> dict[str, Any]:
    return {
        "plugins": [
            {"type": "dcgm-data-source", "name": "dcgm-source", "parameters": {"port": port}},
            {"type": "dcgm-extractor"},
            {"type": "max-score-picker"},
        ],
        "dataLayer": {
            "sources": [
                {"pluginRef": "dcgm-source", "extractors": [{"pluginRef": "dcgm-extractor"}]}
            ]
        },
    }


def test_wiring_asks_the_source_for_its_extractors_families() -> None:
    pset = build(_gpu_doc(9400))
    source = pset.plugins["dcgm-source"]
    assert isinstance(source, DcgmDataSource)
    assert source.families == FAMILIES
    assert [w.name for w in pset.data_sources] == ["dcgm-source"]


async def test_gateway_publishes_each_pods_gpu_utilization(
    aiohttp_server: Any, start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """A DaemonSet-style exporter serving every pod's samples (its `pod` label names the
    simulated pods); each pod gets its own value, refreshed as the page changes."""
    page = {"a": 20.0, "b": 70.0}

    async def metrics(request: web.Request) -> web.Response:
        lines = [f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",pod="{pod}"}} {v}' for pod, v in page.items()]
        return web.Response(text="\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    exporter = await aiohttp_server(app)
    pods = [await start_pod(name="a"), await start_pod(name="b")]
    doc = _gpu_doc(exporter.port)
    # the exporter listens on 127.0.0.1 like the pods: the pods' host with its port
    doc["endpoints"] = [{"name": p.name, "url": p.url} for p in pods]
    gw = await start_gateway(parse_config(doc, "<test>"))

    def gpu(name: str) -> float | None:
        endpoint = gw.gateway.pool.get(name)
        assert endpoint is not None
        return read_attribute(endpoint, "GPUUtilization", "dcgm-extractor")

    await eventually(lambda: gpu("a") == 0.2 and gpu("b") == 0.7)
    page["b"] = 10.0
    await eventually(lambda: gpu("b") == 0.1)
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim-model", "prompt": "x", "max_tokens": 1}
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            assert r.status == 200


def test_config_error_names_the_useNodeAddress_fix() -> None:
    doc = _gpu_doc(9400)
    doc["plugins"][0]["parameters"]["useNodeAddress"] = True
    with pytest.raises(ConfigError, match="useNodeAddress"):
        build(doc)
