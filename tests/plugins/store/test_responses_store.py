"""responses-store as a plugin: parameters, the in-memory backend, and its hooks driven with
plain objects."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from heimdall_proxy.builtins import load_builtin_plugins
from heimdall_proxy.config import ConfigError, parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.loader import build_plugins
from heimdall_proxy.framework.plugins import (
    Lifecycle,
    PrepareData,
    ResponseComplete,
    ResponsesStoreAPI,
    ResponseStreaming,
)
from heimdall_proxy.framework.types import InferenceRequest
from heimdall_proxy.plugins.store.backends import InMemoryBackend
from heimdall_proxy.plugins.store.params import ResponsesStoreParams
from heimdall_proxy.plugins.store.responses_store import ResponsesStore, make_backend
from heimdall_proxy.plugins.store.tiered import TieredBackend
from tests.helpers import ep
from tests.plugins.helpers import ctx

REGISTRY = load_builtin_plugins()


def plugin(params: dict[str, Any] | None = None, backend: Any = None) -> ResponsesStore:
    handle = PluginHandle(pool=EndpointPool([]))
    return ResponsesStore(
        "responses-store", ResponsesStoreParams.model_validate(params or {}), handle, backend
    )


def request(data: dict[str, Any]) -> InferenceRequest:
    data = {"model": "m", **data}
    return InferenceRequest(
        api="responses",
        path="/v1/responses",
        model="m",
        body=orjson.dumps(data),
        data=data,
        headers={},
    )


def response(rid: str, text: str = "out") -> dict[str, Any]:
    item = {"id": f"msg_{rid}", "type": "message", "role": "assistant"}
    item["content"] = [{"type": "output_text", "text": text}]
    return {"id": rid, "object": "response", "status": "completed", "output": [item]}


async def serve(store: ResponsesStore, data: dict[str, Any], rid: str, status: int = 200) -> Any:
    """One non-streamed request through the plugin's hooks, as the gateway calls them."""
    req = request(data)
    await store.prepare_data(req, [])
    c = ctx(req, ep("pod"))
    c.status = status
    c.response_body = orjson.dumps(response(rid))
    await store.response_complete(c)
    return req


# ---- parameters ------------------------------------------------------------------------


def test_implements_its_extension_points() -> None:
    store = plugin()
    for proto in (PrepareData, ResponseStreaming, ResponseComplete, Lifecycle, ResponsesStoreAPI):
        assert isinstance(store, proto)


def test_default_backend_is_in_memory_for_a_day() -> None:
    backend = make_backend(ResponsesStoreParams())
    assert isinstance(backend, InMemoryBackend)
    assert (backend.ttl, backend.max_entries, backend.max_entry_bytes) == (86400, 10000, 1048576)


def test_tiered_takes_precedence_and_has_the_reference_defaults() -> None:
    params = ResponsesStoreParams.model_validate(
        {
            "storeConfig": {
                "inMemoryConfig": {"ttl": "1h"},
                "tieredConfig": {
                    "redis": {"address": "valkey://cache:6380"},
                    "mongo": {"uri": "mongodb://mongo:27017"},
                },
            }
        }
    )
    backend = make_backend(params)
    assert isinstance(backend, TieredBackend)
    assert backend.target.url == "redis://cache:6380"
    tiered = params.store_config.tiered_config  # type: ignore[union-attr]
    assert tiered is not None and tiered.redis is not None and tiered.mongo is not None
    assert (tiered.redis.ttl, tiered.redis.max_entry_bytes, tiered.redis.db) == (86400, 1048576, 0)
    mongo = tiered.mongo
    assert (mongo.database, mongo.collection, mongo.ttl, mongo.timeout) == (
        "heimdall",
        "responses",
        720 * 3600,
        0.5,
    )
    stream = tiered.stream
    assert (stream.key, stream.consumer_group, stream.max_len, stream.batch_size) == (
        "heimdall:responses:mongo_sync",
        "mongo-sync",
        1000000,
        100,
    )
    assert (stream.block_timeout, stream.claim_age) == (1.0, 30.0)


def build_error(params: dict[str, Any]) -> str:
    cfg = parse_config(
        {
            "featureGates": ["prepareDataPlugins"],
            "plugins": [{"type": "responses-store", "parameters": params}],
        }
    )
    handle = PluginHandle(pool=EndpointPool([]), feature_gates=frozenset(cfg.epp.feature_gates))
    with pytest.raises(ConfigError) as info:
        build_plugins(cfg.epp, REGISTRY, handle)
    return str(info.value)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"storeConfig": {}}, "set inMemoryConfig or tieredConfig"),
        ({"storeConfig": {"tieredConfig": {}}}, "tieredConfig needs redis"),
        (
            {"storeConfig": {"tieredConfig": {"redis": {}}}},
            "set address (a redis:// URL) or addresses",
        ),
        (
            {"storeConfig": {"tieredConfig": {"redis": {"address": "r:1", "addresses": ["a:1"]}}}},
            "either address or addresses",
        ),
        (
            {"storeConfig": {"tieredConfig": {"redis": {"address": "http://x"}}}},
            "redis:// or valkey:// URL",
        ),
        (
            {"storeConfig": {"tieredConfig": {"redis": {"addresses": ["a:1", "b:1"], "db": 2}}}},
            "Cluster",
        ),
        (
            {"storeConfig": {"tieredConfig": {"redis": {"address": "r:1"}, "mongo": {}}}},
            "tieredConfig.mongo.uri",
        ),
        ({"storeConfig": {"inMemoryConfig": {"ttl": "soon"}}}, "inMemoryConfig.ttl"),
        ({"storeConfig": {"inMemoryConfig": {"maxEntries": 0}}}, "maxEntries"),
    ],
)
def test_bad_parameters_are_config_errors(params: dict[str, Any], message: str) -> None:
    error = build_error(params)
    assert "responses-store" in error
    assert message in error, error


def test_unknown_nested_parameter_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    cfg = parse_config(
        {
            "featureGates": ["prepareDataPlugins"],
            "plugins": [
                {
                    "type": "responses-store",
                    "parameters": {"storeConfig": {"inMemoryConfig": {"maxEntrys": 3}}},
                }
            ],
        }
    )
    handle = PluginHandle(pool=EndpointPool([]), feature_gates=frozenset(cfg.epp.feature_gates))
    with caplog.at_level(logging.WARNING):
        build_plugins(cfg.epp, REGISTRY, handle)
    assert "ignoring unknown parameters storeConfig.inMemoryConfig.maxEntrys" in caplog.text


# ---- the in-memory backend -------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_in_memory_ttl_and_lru() -> None:
    clock = Clock()
    mem = InMemoryBackend(ttl=10, max_entries=2, max_entry_bytes=100, clock=clock)
    await mem.put("a", b"A")
    clock.now += 5
    await mem.put("b", b"B")
    assert await mem.get("a") == b"A"  # a becomes the most recently used
    await mem.put("c", b"C")  # evicts b
    assert (await mem.get("b"), len(mem)) == (None, 2)
    clock.now += 5  # a is 10 s old: expired
    assert await mem.get("a") is None
    assert await mem.get("c") == b"C"
    assert await mem.delete("c") is True
    assert await mem.delete("c") is False


async def test_in_memory_drops_expired_entries_when_written() -> None:
    clock = Clock()
    mem = InMemoryBackend(ttl=1, max_entries=100, max_entry_bytes=100, clock=clock)
    for i in range(10):
        await mem.put(str(i), b"x")
    clock.now += 2
    await mem.put("new", b"y")
    assert len(mem) == 1


async def test_in_memory_bounds_the_total_bytes() -> None:
    mem = InMemoryBackend(ttl=0, max_entries=100, max_entry_bytes=100, max_total_bytes=250)
    for name in "abc":
        await mem.put(name, b"x" * 100)
    assert await mem.get("a") is None  # 300 bytes > 250: the oldest went
    assert mem.total_bytes == 200
    await mem.put("b", b"y" * 10)  # replacing an entry counts its new size only
    assert mem.total_bytes == 110
    await mem.delete("c")
    assert mem.total_bytes == 10


async def test_in_memory_ttl_zero_keeps_entries() -> None:
    clock = Clock()
    mem = InMemoryBackend(ttl=0, max_entries=1, max_entry_bytes=100, clock=clock)
    await mem.put("a", b"A")
    clock.now += 1e9
    assert await mem.get("a") == b"A"


# ---- the hooks ---------------------------------------------------------------------------


async def test_continuation_is_rewritten_and_stored() -> None:
    store = plugin()
    await serve(store, {"input": "a", "instructions": "old"}, "r1")
    req = await serve(store, {"input": "b", "previous_response_id": "r1"}, "r2")
    assert req.body_modified
    assert "previous_response_id" not in req.data
    assert "instructions" not in req.data
    assert [i.get("content") for i in req.data["input"]][::2] == ["a", "b"]
    assert req.data["input"][1]["id"] == "msg_r1"
    assert "a" in req.prompt_text() and "out" in req.prompt_text()
    stored = await store.get_response("r2", "")
    assert stored is not None and stored["previous_response_id"] == "r1"
    items = await store.get_input_items("r2", "")
    assert items is not None and len(items) == 3


async def test_unknown_previous_id_raises_request_error() -> None:
    store = plugin()
    with pytest.raises(RequestError) as info:
        await store.prepare_data(request({"input": "x", "previous_response_id": "nope"}), [])
    assert (info.value.status, info.value.code, info.value.param) == (
        404,
        "previous_response_not_found",
        "previous_response_id",
    )


class BrokenBackend(InMemoryBackend):
    async def get(self, response_id: str) -> bytes | None:
        raise ConnectionError("down")


async def test_unreadable_store_is_503_for_a_continuation() -> None:
    store = plugin(backend=BrokenBackend(1, 1, 1000))
    await store.prepare_data(request({"input": "x"}), [])  # no lookup, no error
    with pytest.raises(RequestError) as info:
        await store.prepare_data(request({"input": "x", "previous_response_id": "r"}), [])
    assert info.value.status == 503 and info.value.code == "store_unavailable"


async def test_other_apis_and_failures_are_left_alone() -> None:
    store = plugin()
    chat = request({"previous_response_id": "r"})
    chat.api = "chat"
    await store.prepare_data(chat, [])
    assert not chat.body_modified
    await serve(store, {"input": "x"}, "r-500", status=500)
    await serve(store, {"input": "x", "store": False}, "r-nostore")
    assert await store.get_response("r-500", "") is None
    assert await store.get_response("r-nostore", "") is None


async def test_streamed_response_is_readable_from_its_final_event() -> None:
    mem = InMemoryBackend(60, 10, 10_000)
    store = plugin(backend=mem)
    req = request({"input": "x", "stream": True})
    c = ctx(req, ep("pod"))
    c.status = 200
    c.upstream_response_headers = {"Content-Type": "text/event-stream; charset=utf-8"}
    event = {"type": "response.completed", "response": response("r-s")}
    data = b"data: " + orjson.dumps(event) + b"\n\n"
    await store.response_streaming(c, data[:10])
    await store.response_streaming(c, data[10:])
    # staged: visible before response_complete wrote it to the backend
    assert len(mem) == 0
    assert (await store.get_response("r-s", "")) == response("r-s")
    await store.response_complete(c)
    assert len(mem) == 1 and store._staged == {}


async def test_json_body_relayed_in_chunks_is_stored() -> None:
    # an upstream that sends JSON without Content-Length is relayed as a stream
    store = plugin({"storeConfig": {"inMemoryConfig": {"maxEntryBytes": 400}}})
    for rid, text in (("r-small", "out"), ("r-big", "x" * 500)):
        c = ctx(request({"input": "x"}), ep("pod"))
        c.status = 200
        c.upstream_response_headers = {"Content-Type": "application/json"}
        body = orjson.dumps(response(rid, text))
        for i in range(0, len(body), 7):
            await store.response_streaming(c, body[i : i + 7])
        await store.response_complete(c)
    assert await store.get_response("r-small", "") == response("r-small")
    assert await store.get_response("r-big", "") is None


async def test_delete_and_unknown() -> None:
    store = plugin()
    await serve(store, {"input": "x"}, "r1")
    assert await store.delete_response("r1", "") is True
    assert await store.delete_response("r1", "") is False
    assert await store.get_response("r1", "") is None
    assert await store.get_input_items("r1", "") is None
