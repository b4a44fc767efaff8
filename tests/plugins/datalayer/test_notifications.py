"""endpoint-notification-source (pods joining and leaving, told to endpoint extractors) and
k8s-notification-source (needs a cluster: refused without discovery.kubernetes)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from heimdall_proxy.config.build import build_plugins
from heimdall_proxy.config.gateway import ConfigError, parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.datalayer.refresher import PoolRefresher, RefreshOptions
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.requestcontrol.producers.mm_embeddings import (
    MMEmbeddingsCacheProducer,
)
from tests.plugins.datalayer.test_models import build, build_error

BUILTIN = load_builtin_plugins()


def _doc(extractor: str = "mm-embeddings-cache-producer") -> dict[str, Any]:
    return {
        "plugins": [
            {"type": "endpoint-notification-source"},
            {"type": extractor},
            {"type": "queue-scorer"},
        ],
        "dataLayer": {
            "sources": [
                {
                    "pluginRef": "endpoint-notification-source",
                    "extractors": [{"pluginRef": extractor}],
                }
            ]
        },
        "endpoints": [
            {"name": "a", "url": "http://127.0.0.1:1"},
            {"name": "b", "url": "http://127.0.0.1:2"},
        ],
    }


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, bool]] = []

    def endpoint_changed(self, endpoint: Endpoint, removed: bool) -> None:
        self.events.append((endpoint.name, removed))


async def test_pool_changes_reach_the_extractors() -> None:
    cfg = parse_config(_doc(), "<test>")
    pool = EndpointPool(cfg.endpoints)
    pset = build_plugins(cfg.epp, BUILTIN, PluginHandle(pool))
    producer = pset.plugins["mm-embeddings-cache-producer"]
    assert isinstance(producer, MMEmbeddingsCacheProducer)
    producer.caches["b"] = {"h": None}  # type: ignore[assignment]
    recorder = Recorder()
    async with aiohttp.ClientSession() as session:
        refresher = PoolRefresher(
            pool, session, RefreshOptions(health_interval=0), pset.data_sources
        )
        refresher.watchers.append(("recorder", recorder))
        refresher.sync()  # start-up: every pod joins
        assert recorder.events == [("a", False), ("b", False)]
        pool.replace([cfg.endpoints[0]])
        refresher.sync()
        assert recorder.events[2:] == [("b", True)]
        assert "b" not in producer.caches  # dropped at once, not on the next sweep
        refresher.sync()
        assert len(recorder.events) == 3  # nothing changed, nothing told


def test_an_extractor_that_is_not_an_endpoint_extractor_is_refused() -> None:
    error = build_error(_doc("max-score-picker"))
    assert "'max-score-picker' is not an endpoint extractor (it is: Picker)" in error
    assert "tells its extractors of pods joining and leaving" in error


def test_the_precise_producer_is_an_endpoint_extractor() -> None:
    doc = _doc("precise-prefix-cache-producer")
    assert [len(w.extractors) for w in build(doc).data_sources] == [1]


K8S = {"type": "k8s-notification-source", "parameters": {"version": "v1", "kind": "Pod"}}


def test_k8s_source_without_a_cluster_says_what_to_use_instead() -> None:
    error = build_error({"plugins": [K8S, {"type": "queue-scorer"}]})
    assert "needs a cluster" in error and "v1/Pod" in error
    assert "discovery.kubernetes" in error and "endpoint-notification-source" in error


def test_k8s_source_with_the_kubernetes_discovery_is_accepted() -> None:
    cfg = parse_config({"plugins": [K8S, {"type": "queue-scorer"}]}, "<test>")
    handle = PluginHandle(EndpointPool([]), kubernetes=True)
    pset = build_plugins(cfg.epp, BUILTIN, handle)
    assert "k8s-notification-source" in pset.plugins
    bad = parse_config({"plugins": [{**K8S, "parameters": {"version": "v1", "kind": ""}}]}, "t")
    with pytest.raises(ConfigError, match="version and kind are required"):
        build_plugins(bad.epp, BUILTIN, handle)
