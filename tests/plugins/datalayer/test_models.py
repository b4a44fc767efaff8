"""models-data-source and model-server-protocol-models: the plugins, their wiring through
the config's `data` field, and the gateway learning models through them."""

from __future__ import annotations

import logging
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from heimdall_proxy.config.build import PluginSet, build_plugins
from heimdall_proxy.config.gateway import ConfigError, parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.plugins import DataExtractor, DataSource
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.datalayer.models import (
    MODEL_SERVER_PROTOCOL_MODELS_TYPE,
    ModelsDataSource,
    ModelsDataSourceParams,
    ModelServerProtocolModels,
)
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config
from tests.helpers import ep

BUILTIN = load_builtin_plugins()
GATES = ["dataLayer"]
WIRING = {"sources": [{"pluginRef": "models", "extractors": [{"pluginRef": "extract"}]}]}


def data_epp(
    source_params: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    gates: list[str] | None = None,
) -> dict[str, Any]:
    source: dict[str, Any] = {"type": "models-data-source", "name": "models"}
    if source_params:
        source["parameters"] = source_params
    return {
        "featureGates": GATES if gates is None else gates,
        "plugins": [
            {"type": "queue-scorer"},
            source,
            {"type": "model-server-protocol-models", "name": "extract"},
        ],
        "data": WIRING if data is None else data,
    }


def build(doc: dict[str, Any], registry: Registry = BUILTIN) -> PluginSet:
    cfg = parse_config(doc, "test.yaml")
    handle = PluginHandle(
        pool=EndpointPool(cfg.endpoints), feature_gates=frozenset(cfg.epp.feature_gates)
    )
    return build_plugins(cfg.epp, registry, handle)


def build_error(doc: dict[str, Any], registry: Registry = BUILTIN) -> str:
    with pytest.raises(ConfigError) as info:
        build(doc, registry)
    return str(info.value)


# ---- the plugins -------------------------------------------------------------------------


def source(**params: Any) -> ModelsDataSource:
    return ModelsDataSource(
        "models", ModelsDataSourceParams.model_validate(params), PluginHandle(EndpointPool([]))
    )


def extractor() -> ModelServerProtocolModels:
    return ModelServerProtocolModels("extract", NoParams(), PluginHandle(EndpointPool([])))


def test_they_are_a_source_and_an_extractor_of_the_same_data() -> None:
    src, ext = source(), extractor()
    assert isinstance(src, DataSource) and not isinstance(src, DataExtractor)
    assert isinstance(ext, DataExtractor) and not isinstance(ext, DataSource)
    assert src.output_type == ext.input_type


def test_source_url_scheme_and_path() -> None:
    plain = Endpoint("p", "http://10.0.0.1:8000", "10.0.0.1", 8000)
    tls = Endpoint("t", "https://10.0.0.2:8443", "10.0.0.2", 8443)
    assert source().url(plain) == "http://10.0.0.1:8000/v1/models"
    assert source().url(tls) == "https://10.0.0.2:8443/v1/models"
    assert source(scheme="https", path="/models").url(plain) == "https://10.0.0.1:8000/models"
    assert source(scheme="http").url(tls) == "http://10.0.0.2:8443/v1/models"
    with pytest.raises(ValueError, match="path must start with '/'"):
        source(path="v1/models")
    with pytest.raises(ValueError, match="scheme"):
        source(scheme="ftp")


class FakeResponse:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body

    async def __aenter__(self) -> FakeResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self.body


class FakeSession:
    def __init__(self, status: int = 200, body: bytes = b'{"data": []}') -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.status, self.body = status, body

    def get(self, url: str, **kwargs: Any) -> FakeResponse:
        self.calls.append((url, kwargs))
        return FakeResponse(self.status, self.body)


async def test_collect_checks_tls_only_when_asked() -> None:
    session = FakeSession()
    assert await source().collect(ep("a"), session) == {"data": []}  # type: ignore[arg-type]
    await source(insecureSkipVerify=False).collect(ep("a"), session)  # type: ignore[arg-type]
    assert [kw["ssl"] for _, kw in session.calls] == [False, True]


async def test_collect_fails_on_a_bad_answer() -> None:
    with pytest.raises(ValueError, match="HTTP 404"):
        await source().collect(ep("a"), FakeSession(404))  # type: ignore[arg-type]
    with pytest.raises(orjson.JSONDecodeError):
        await source().collect(ep("a"), FakeSession(200, b"<html>"))  # type: ignore[arg-type]


def test_extractor_publishes_models_and_cards() -> None:
    endpoint = ep("a")
    cards = [{"id": "base", "object": "model"}, {"id": "lora-1", "parent": "base"}, {"x": 1}]
    extractor().extract(endpoint, {"object": "list", "data": cards})
    assert endpoint.models == frozenset({"base", "lora-1"})
    assert endpoint.model_cards["lora-1"]["parent"] == "base"
    with pytest.raises(ValueError, match="not a model list"):
        extractor().extract(endpoint, {"models": []})
    assert endpoint.models == frozenset({"base", "lora-1"})  # unchanged by bad data


# ---- wiring ------------------------------------------------------------------------------


def test_wired_source_and_extractor() -> None:
    pset = build(data_epp())
    assert [(w.name, [n for n, _ in w.extractors]) for w in pset.data_sources] == [
        ("models", ["extract"])
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"sources": [{"pluginRef": "nope"}]},
            "data.sources[0]: pluginRef 'nope' names no declared plugin",
        ),
        (
            {"sources": [{"pluginRef": "queue-scorer"}]},
            "plugin type 'queue-scorer' is not a data source (it is: Scorer)",
        ),
        (
            {"sources": [{"pluginRef": "extract"}]},
            "plugin type 'model-server-protocol-models' is not a data source",
        ),
        (
            {"sources": [{"pluginRef": "models", "extractors": [{"pluginRef": "models"}]}]},
            "data.sources[0].extractors[0]: pluginRef 'models': plugin type "
            "'models-data-source' is not a data extractor (it is: DataSource)",
        ),
        (
            {"sources": [{"pluginRef": "models", "extractors": [{"pluginRef": "gone"}]}]},
            "data.sources[0].extractors[0]: pluginRef 'gone' names no declared plugin",
        ),
        (
            {
                "sources": [
                    {"pluginRef": "models", "extractors": [{"pluginRef": "extract"}]},
                    {"pluginRef": "models", "extractors": [{"pluginRef": "extract"}]},
                ]
            },
            "data.sources[1]: pluginRef 'models': the source is listed twice",
        ),
        (
            {
                "sources": [
                    {
                        "pluginRef": "models",
                        "extractors": [{"pluginRef": "extract"}, {"pluginRef": "extract"}],
                    }
                ]
            },
            "the extractor is listed twice for this source",
        ),
    ],
)
def test_wiring_errors(data: dict[str, Any], message: str) -> None:
    error = build_error(data_epp(data=data))
    assert message in error, error


class MetricsSource(BasePlugin[NoParams]):
    type = "fake-metrics-source"
    output_type = "prometheus-text"

    async def collect(self, endpoint: Endpoint, session: Any) -> object:
        return ""


def test_extractor_must_read_what_the_source_produces() -> None:
    registry = Registry()
    for spec in BUILTIN:
        registry.register(spec.type_name, spec.params, feature_gate=spec.feature_gate)(spec.factory)
    registry.register("fake-metrics-source")(MetricsSource)
    doc = data_epp(
        data={"sources": [{"pluginRef": "metrics", "extractors": [{"pluginRef": "extract"}]}]}
    )
    doc["plugins"].append({"type": "fake-metrics-source", "name": "metrics"})
    error = build_error(doc, registry)
    assert (
        "the extractor reads 'openai-model-list' data but source 'metrics' produces "
        "'prometheus-text'"
    ) in error


def test_the_data_layer_needs_no_gate_any_more() -> None:
    # llm-d made its data layer unconditional: its configs no longer list the gate
    pset = build(data_epp(gates=[]))
    assert pset.skipped == {}
    assert [w.name for w in pset.data_sources] == ["models"]


def test_a_gated_source_and_its_wiring_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry()
    for spec in BUILTIN:
        gate = "dataLayer" if spec.type_name.startswith("model") else spec.feature_gate
        registry.register(spec.type_name, spec.params, feature_gate=gate)(spec.factory)
    with caplog.at_level(logging.WARNING):
        pset = build(data_epp(gates=[]), registry)
    assert pset.skipped == {"models": "dataLayer", "extract": "dataLayer"}
    assert pset.data_sources == []
    assert "data.sources[0]: pluginRef 'models' is skipped because feature gate" in caplog.text


def test_unwired_and_extractorless_plugins_are_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        pset = build(data_epp(data={"sources": [{"pluginRef": "models"}]}))
    assert pset.data_sources == []
    assert "has no extractor; nothing would read its data, so it is not polled" in caplog.text
    assert "data-layer plugin 'extract' is declared but not wired in data.sources" in caplog.text


def test_extractor_skipped_alone_leaves_the_source_unpolled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # an ungated source whose only extractor is skipped: the source is not polled
    registry = Registry()
    for spec in BUILTIN:
        gate = "dataLayer" if spec.type_name == MODEL_SERVER_PROTOCOL_MODELS_TYPE else None
        registry.register(spec.type_name, spec.params, feature_gate=gate)(spec.factory)
    with caplog.at_level(logging.WARNING):
        pset = build(data_epp(gates=[]), registry)
    assert pset.data_sources == []
    assert "extractors[0]: pluginRef 'extract' is skipped" in caplog.text


# ---- through the gateway -----------------------------------------------------------------


async def test_gateway_learns_models_through_the_data_layer(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(model="alpha"), await start_pod(model="beta")]
    gw = await start_gateway(make_config(pods, data_epp()))
    sdk = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="t", max_retries=0)
    try:
        assert [m.id for m in (await sdk.models.list()).data] == ["alpha", "beta"]
        for _ in range(3):
            await sdk.completions.create(model="beta", prompt="x", max_tokens=1)
        assert [len(p.pod.received) for p in pods] == [0, 3]  # only the pod serving beta
        with pytest.raises(openai.NotFoundError):
            await sdk.completions.create(model="gamma", prompt="x", max_tokens=1)
    finally:
        await sdk.close()


async def test_source_path_replaces_the_builtin_model_poll(
    aiohttp_server: Any, start_gateway: GatewayFactory
) -> None:
    asked: list[str] = []

    async def models(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"object": "list", "data": [{"id": "custom-model"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/custom/models", models)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).rstrip("/")
    doc = data_epp({"path": "/custom/models"})
    doc["endpoints"] = [{"name": "stub", "url": url}]
    gw = await start_gateway(parse_config(doc, "<test>"), models_interval=0.05)
    await eventually(lambda: len(asked) >= 3)
    assert set(asked) == {"/custom/models"}
    assert gw.gateway.pool.models() == [{"id": "custom-model"}]
