"""The endpoint pool: candidate selection by model and health, model listing."""

from __future__ import annotations

from typing import Any

import pytest

from heimdall_proxy.config.gateway import EndpointConfig, parse_config
from heimdall_proxy.datalayer.pool import EndpointPool, ModelNotFoundError, NoEndpointsError


def make_pool(*specs: dict[str, Any]) -> EndpointPool:
    configs = [
        EndpointConfig.model_validate({"url": f"http://{s['name']}:8000", **s}) for s in specs
    ]
    return EndpointPool(configs)


def serve(pool: EndpointPool, name: str, *models: str, healthy: bool = True) -> None:
    e = pool.get(name)
    assert e is not None
    e.models = frozenset(models)
    e.model_cards = {m: {"id": m, "object": "model", "owned_by": name} for m in models}
    e.healthy = healthy


def names(endpoints: list[Any]) -> list[str]:
    return [e.name for e in endpoints]


def test_pool_builds_one_endpoint_per_config() -> None:
    cfg = parse_config(
        {
            "endpoints": [
                {
                    "name": "a",
                    "url": "http://10.0.0.1:8001",
                    "labels": {"mif.moreh.io/role": "decode"},
                    "kvEvents": "tcp://10.0.0.1:5557",
                },
                {"name": "b", "url": "https://b.example"},
            ]
        }
    )
    pool = EndpointPool(cfg.endpoints)
    a, b = pool.endpoints()
    assert (a.name, a.url, a.host, a.port) == ("a", "http://10.0.0.1:8001", "10.0.0.1", 8001)
    assert a.labels == {"mif.moreh.io/role": "decode"}
    assert a.kv_events == "tcp://10.0.0.1:5557"
    assert a.hostport == "10.0.0.1:8001"
    assert (b.host, b.port, b.kv_events) == ("b.example", 443, None)
    assert a.models is None  # unknown until /v1/models is read
    assert a.healthy is True
    assert pool.get("a") is a
    assert pool.get("zzz") is None
    assert pool.endpoints() is pool.endpoints()  # no copy on the hot path
    assert pool.static_models == set()


def test_candidates_are_healthy_pods_serving_the_model() -> None:
    pool = make_pool({"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"})
    serve(pool, "a", "llama")
    serve(pool, "b", "qwen")
    serve(pool, "c", "llama", "qwen")
    serve(pool, "d", "llama", healthy=False)
    assert names(pool.candidates("llama")) == ["a", "c"]
    assert names(pool.candidates("qwen")) == ["b", "c"]


def test_lora_adapter_ids_select_pods_that_serve_them() -> None:
    pool = make_pool({"name": "a"}, {"name": "b"})
    serve(pool, "a", "llama", "sql-lora")
    serve(pool, "b", "llama")
    assert names(pool.candidates("sql-lora")) == ["a"]
    assert names(pool.candidates("llama")) == ["a", "b"]


def test_unhealthy_pods_used_when_none_serving_is_healthy() -> None:
    pool = make_pool({"name": "a"}, {"name": "b"}, {"name": "c"})
    serve(pool, "a", "llama", healthy=False)
    serve(pool, "b", "qwen")
    serve(pool, "c", "llama", healthy=False)
    assert names(pool.candidates("llama")) == ["a", "c"]


def test_unknown_model_raises_model_not_found() -> None:
    pool = make_pool({"name": "a"}, {"name": "b"})
    serve(pool, "a", "llama")
    serve(pool, "b", "qwen", healthy=False)
    with pytest.raises(ModelNotFoundError) as info:
        pool.candidates("mistral")
    assert info.value.args == ("mistral",)
    assert isinstance(info.value, LookupError)


def test_pods_with_unknown_models_used_when_nobody_is_known_to_serve() -> None:
    pool = make_pool({"name": "a"}, {"name": "b"}, {"name": "c"})
    serve(pool, "a", "qwen")
    # b and c have not reported their models yet
    assert names(pool.candidates("llama")) == ["b", "c"]
    # ... healthy ones first
    pool.get("b").healthy = False  # type: ignore[union-attr]
    assert names(pool.candidates("llama")) == ["c"]
    pool.get("c").healthy = False  # type: ignore[union-attr]
    assert names(pool.candidates("llama")) == ["b", "c"]


def test_known_servers_beat_unknown_pods() -> None:
    pool = make_pool({"name": "a"}, {"name": "b"})
    serve(pool, "a", "llama")
    assert names(pool.candidates("llama")) == ["a"]


def test_empty_pool_raises_no_endpoints() -> None:
    pool = EndpointPool([])
    with pytest.raises(NoEndpointsError):
        pool.candidates("llama")
    assert pool.models() == []
    assert pool.healthy() == []


def test_healthy_lists_pods_in_rotation() -> None:
    pool = make_pool({"name": "a"}, {"name": "b"}, {"name": "c"})
    pool.get("b").healthy = False  # type: ignore[union-attr]
    assert names(pool.healthy()) == ["a", "c"]


def test_models_is_the_sorted_union_of_healthy_pods() -> None:
    pool = make_pool({"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"})
    serve(pool, "a", "zeta", "llama")
    serve(pool, "b", "llama", "alpha")
    serve(pool, "c", "only-on-sick-pod", healthy=False)
    assert [m["id"] for m in pool.models()] == ["alpha", "llama", "zeta"]
    # one card per id: the first healthy pod's
    llama = next(m for m in pool.models() if m["id"] == "llama")
    assert llama["owned_by"] == "a"


def test_static_models_from_endpoint_config() -> None:
    pool = make_pool(
        {"name": "a", "models": ["llama", "sql-lora"]},
        {"name": "b"},
    )
    a = pool.get("a")
    assert a is not None
    assert a.models == frozenset({"llama", "sql-lora"})
    assert a.model_cards == {
        "llama": {"id": "llama", "object": "model"},
        "sql-lora": {"id": "sql-lora", "object": "model"},
    }
    assert pool.static_models == {"a"}
    assert names(pool.candidates("sql-lora")) == ["a"]
    assert [m["id"] for m in pool.models()] == ["llama", "sql-lora"]


def test_static_empty_model_list_means_serves_nothing() -> None:
    pool = make_pool({"name": "a", "models": []}, {"name": "b", "models": ["x"]})
    assert pool.static_models == {"a", "b"}
    with pytest.raises(ModelNotFoundError):
        pool.candidates("llama")


def test_cached_candidates_follow_health_models_and_replacement() -> None:
    """Candidates are cached per model; a change of any pod's health or model list, or a new
    pod list, is seen by the next call."""
    pool = make_pool({"name": "a"}, {"name": "b"})
    serve(pool, "a", "m")
    serve(pool, "b", "m")
    first = pool.candidates("m")
    assert names(first) == ["a", "b"]
    assert pool.candidates("m") is first  # cached, not rescanned
    pool.get("a").healthy = False  # type: ignore[union-attr]
    assert names(pool.candidates("m")) == ["b"]
    pool.get("b").models = frozenset({"other"})  # type: ignore[union-attr]
    assert names(pool.candidates("m")) == ["a"]  # only an unhealthy pod serves it now
    pool.get("a").healthy = True  # type: ignore[union-attr]
    pool.get("b").healthy = True  # type: ignore[union-attr]  # unchanged: no invalidation
    assert names(pool.candidates("m")) == ["a"]
    pool.replace(
        [EndpointConfig.model_validate({"name": n, "url": f"http://{n}:8000"}) for n in "cd"]
    )
    assert names(pool.candidates("m")) == ["c", "d"]  # models not known yet: may serve it
