"""responses-store as a plugin: parameters, the in-memory backend, and its hooks driven with
plain objects."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from heimdall_proxy.config.build import build_plugins
from heimdall_proxy.config.gateway import ConfigError, parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.plugins import (
    Lifecycle,
    PrepareData,
    ResponseComplete,
    ResponsesStoreAPI,
    ResponseStreaming,
)
from heimdall_proxy.framework.types import InferenceRequest
from heimdall_proxy.plugins.builtins import load_builtin_plugins
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

    async def chain(self, response_id: str, limit: int) -> list[bytes]:
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


async def test_streamed_response_is_stored_before_its_final_event_is_relayed() -> None:
    mem = InMemoryBackend(60, 10, 10_000)
    store = plugin(backend=mem)
    req = request({"input": "x", "stream": True})
    c = ctx(req, ep("pod"))
    c.status = 200
    c.upstream_response_headers = {"Content-Type": "text/event-stream; charset=utf-8"}
    await store.response_received(c)
    assert c.chunk_filter is not None
    event = {"type": "response.completed", "response": response("r-s")}
    data = b"data: " + orjson.dumps(event) + b"\n\n"
    assert await c.chunk_filter(data[:10]) == b""  # half an event is held back
    assert len(mem) == 0
    # read-your-writes: stored by the time the client can see the final event
    assert await c.chunk_filter(data[10:]) == data
    assert len(mem) == 1
    assert (await store.get_response("r-s", "")) == response("r-s")
    assert await c.chunk_filter(b"") == b""
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


# ---- conversations as linked turns -------------------------------------------------------


async def chain(store: ResponsesStore, turns: int, prefix: str = "r") -> list[InferenceRequest]:
    """`turns` short turns, each continuing the previous one."""
    reqs = []
    for i in range(turns):
        data: dict[str, Any] = {"input": f"turn {i}"}
        if i:
            data["previous_response_id"] = f"{prefix}{i - 1}"
        reqs.append(await serve(store, data, f"{prefix}{i}"))
    return reqs


async def test_each_entry_keeps_only_its_own_turn() -> None:
    # maxEntryBytes is far below the conversation's size: it bounds one turn, not the history
    mem = InMemoryBackend(0, 10_000, 600)
    store = plugin(backend=mem)
    reqs = await chain(store, 200)
    sizes = [len(await mem.get(f"r{i}") or b"") for i in range(200)]
    assert all(sizes), "every turn is stored"
    assert max(sizes) < 2 * min(sizes)  # linear in the conversation, not its square
    assert mem.total_bytes == sum(sizes)
    # the pod still reads the whole conversation, in order
    last = reqs[-1].data["input"]
    assert len(last) == 2 * 199 + 1
    assert [i["content"] for i in last[::2]] == [f"turn {i}" for i in range(200)]
    assert [i["id"] for i in last[1::2]] == [f"msg_r{i}" for i in range(199)]
    items = await store.get_input_items("r199", "")
    assert items is not None and len(items) == len(last)
    assert [i["id"] for i in items[1::2]] == [f"msg_r{i}" for i in range(199)]
    # ids of listed items are the same in every response of the conversation
    earlier = await store.get_input_items("r100", "")
    assert earlier is not None and [i["id"] for i in earlier] == [i["id"] for i in items[:201]]
    stored = await store.get_response("r199", "")
    assert stored is not None and stored["previous_response_id"] == "r198"


async def test_a_broken_chain_is_404_never_a_truncated_history() -> None:
    store = plugin()
    await chain(store, 3)
    assert await store.delete_response("r0", "") is True
    with pytest.raises(RequestError) as info:
        await store.prepare_data(request({"input": "x", "previous_response_id": "r2"}), [])
    err = info.value
    assert (err.status, err.code, err.param) == (
        404,
        "previous_response_not_found",
        "previous_response_id",
    )
    assert "'r2'" in err.message and "'r0'" in err.message
    with pytest.raises(RequestError) as listed:
        await store.get_input_items("r2", "")
    assert listed.value.status == 404 and "'r0'" in listed.value.message
    # the response itself is still there
    assert (await store.get_response("r2", "")) is not None


async def test_ancestors_of_another_owner_break_the_chain() -> None:
    store = plugin()
    await chain(store, 2)
    # r0 replaced by another caller's entry under the same id (a reused id)
    await store.backend.delete("r0")
    await store.backend.put("r0", orjson.dumps({"owner": "key:other", "response": response("r0")}))
    with pytest.raises(RequestError) as info:
        await store.prepare_data(request({"input": "x", "previous_response_id": "r1"}), [])
    assert info.value.status == 404


async def test_continuing_renews_the_ancestors() -> None:
    # a conversation in use never expires under its latest turn, nor is it evicted by LRU
    clock = Clock()
    mem = InMemoryBackend(ttl=10, max_entries=3, max_entry_bytes=10_000, clock=clock)
    store = plugin(backend=mem)
    await serve(store, {"input": "a"}, "r0")
    clock.now += 6
    await serve(store, {"input": "b", "previous_response_id": "r0"}, "r1")
    clock.now += 6  # r0 was stored 12 s ago, but read 6 s ago
    await serve(store, {"input": "z"}, "other")
    await serve(store, {"input": "c", "previous_response_id": "r1"}, "r2")
    assert await mem.get("other") is None  # the least recently used went, not r0
    req = await serve(store, {"input": "d", "previous_response_id": "r2"}, "r3")
    assert len(req.data["input"]) == 7


@pytest.mark.slow
async def test_a_long_walk_lets_the_event_loop_run() -> None:
    store = plugin(backend=InMemoryBackend(0, 100_000, 10_000))
    await chain(store, 3000)
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    ticks = 0
    req = request({"input": "x", "previous_response_id": "r2999"})
    await store.prepare_data(req, [])
    done = True
    await task
    assert len(req.data["input"]) == 6001
    assert ticks >= 3, ticks


async def test_an_entry_without_a_link_is_the_whole_history() -> None:
    # an entry stored by an earlier version holds its whole input: still continued
    store = plugin()
    old = {"owner": "", "response": response("old"), "input": [{"role": "user", "content": "a"}]}
    old["input"].append({"type": "message", "role": "assistant", "content": "b"})
    await store.backend.put("old", orjson.dumps(old))
    req = await serve(store, {"input": "c", "previous_response_id": "old"}, "new")
    roles = [i["role"] for i in req.data["input"]]
    assert roles == ["user", "assistant", "assistant", "user"]
    assert req.data["input"][-1]["content"] == "c"
    items = await store.get_input_items("new", "")
    assert items is not None and len(items) == 4


async def test_oversize_non_streamed_turn_says_so_in_a_header() -> None:
    store = plugin({"storeConfig": {"inMemoryConfig": {"maxEntryBytes": 300}}})
    req = request({"input": "x"})
    c = ctx(req, ep("pod"))
    c.status = 200
    c.response_body = orjson.dumps(response("r-big", "x" * 500))
    await store.response_complete(c)
    assert c.response_headers.get("x-heimdall-store") == "too-large"
    assert await store.get_response("r-big", "") is None


def sse_stream(rid: str, text: str) -> bytes:
    created = {"type": "response.created", "sequence_number": 0, "response": {"id": rid}}
    final = {"type": "response.completed", "sequence_number": 1, "response": response(rid, text)}
    return (
        b"event: response.created\ndata: "
        + orjson.dumps(created)
        + b"\n\nevent: response.completed\ndata: "
        + orjson.dumps(final)
        + b"\n\n"
    )


async def relay_stream(store: ResponsesStore, body: bytes, step: int = 37) -> tuple[bytes, Any]:
    """A stream as the relay passes it: through the plugin's chunk filter, then the hooks."""
    c = ctx(request({"input": "x", "stream": True}), ep("pod"))
    c.status = 200
    c.upstream_response_headers = {"Content-Type": "text/event-stream"}
    await store.response_received(c)
    assert c.chunk_filter is not None
    out = b""
    for i in range(0, len(body), step):
        chunk = body[i : i + step]
        out += await c.chunk_filter(chunk)
        await store.response_streaming(c, chunk)
    out += await c.chunk_filter(b"")
    await store.response_complete(c)
    return out, c


def final_event(out: bytes) -> dict[str, Any]:
    last = out.rstrip(b"\n").split(b"\n\n")[-1]
    assert last.startswith(b"event: response.completed\ndata: "), last
    doc: dict[str, Any] = orjson.loads(last.split(b"data: ", 1)[1])
    return doc


async def test_streamed_turn_says_store_false_when_it_was_not_stored() -> None:
    store = plugin({"storeConfig": {"inMemoryConfig": {"maxEntryBytes": 400}}})
    small = sse_stream("r-small", "out")
    out, _ = await relay_stream(store, small)
    assert out == small  # stored: relayed byte for byte
    assert await store.get_response("r-small", "") == response("r-small")

    big = sse_stream("r-big", "x" * 500)
    out, _ = await relay_stream(store, big)
    final = final_event(out)
    assert final["response"]["store"] is False
    del final["response"]["store"]
    assert final == final_event(big)
    assert out.startswith(big.split(b"\n\n")[0] + b"\n\n")
    assert await store.get_response("r-big", "") is None


class FailingWrites(InMemoryBackend):
    async def put(self, response_id: str, entry: bytes) -> None:
        raise ConnectionError("down")


async def test_streamed_turn_whose_write_failed_says_store_false() -> None:
    store = plugin(backend=FailingWrites(60, 10, 10_000))
    out, _ = await relay_stream(store, sse_stream("r-s", "out"))
    assert final_event(out)["response"]["store"] is False
    assert store.write_failures == 1
    assert store._staged == {}
