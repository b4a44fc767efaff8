"""What a client sees: vLLM's routes and response shapes, stream and not, for every API."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim.conftest import SimFactory

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello there"}]}
COMPLETION = {"model": "sim-model", "prompt": "hello there"}
RESPONSES = {"model": "sim-model", "input": "hello there"}
PATHS = {
    "completions": ("/v1/completions", COMPLETION),
    "chat": ("/v1/chat/completions", CHAT),
    "responses": ("/v1/responses", RESPONSES),
}


async def test_models_health_version_and_unknown_routes(sim: SimFactory) -> None:
    s = await sim(model="llama", lora_modules=["sql-lora"], max_model_len=4096)
    async with s.http.get(f"{s.url}/v1/models") as r:
        doc = await r.json()
    assert doc["object"] == "list"
    assert [(m["id"], m["parent"]) for m in doc["data"]] == [
        ("llama", None),
        ("sql-lora", "llama"),
    ]
    assert doc["data"][0]["max_model_len"] == 4096
    async with s.http.get(f"{s.url}/health") as r:
        assert r.status == 200
    async with s.http.get(f"{s.url}/version") as r:
        assert "version" in await r.json()


@pytest.mark.parametrize("api", sorted(PATHS))
async def test_unknown_model_is_404(sim: SimFactory, api: str) -> None:
    s = await sim()
    path, body = PATHS[api]
    status, doc = await s.post(path, {**body, "model": "nope"})
    assert status == 404
    assert doc["error"]["type"] == "NotFoundError"
    assert "`nope`" in doc["error"]["message"]
    assert s.pod.received[-1].path == path


async def test_completions_non_stream(sim: SimFactory) -> None:
    s = await sim()
    status, doc = await s.post("/v1/completions", {**COMPLETION, "max_tokens": 4})
    assert status == 200
    assert doc["object"] == "text_completion"
    assert doc["id"].startswith("cmpl-")
    choice = doc["choices"][0]
    assert choice["text"] == "the gateway routes tokens"
    assert choice["finish_reason"] == "length"
    assert choice["index"] == 0 and choice["logprobs"] is None
    # BOS + "hello" (2 chunks of 4 characters) + "there" (2)
    assert doc["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert doc["kv_transfer_params"] is None
    assert s.pod.completed == 1


@pytest.mark.parametrize("include_usage", [True, False])
async def test_completions_stream(sim: SimFactory, include_usage: bool) -> None:
    s = await sim()
    body: dict[str, Any] = {**COMPLETION, "max_tokens": 3}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    out = await s.stream("/v1/completions", body)
    data = out.data
    assert data[-1] == "[DONE]"
    chunks = [d for d in data[:-1] if d["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "the gateway routes"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    usage = [d for d in data[:-1] if not d["choices"]]
    if include_usage:
        assert len(usage) == 1 and data[-2] is usage[0]
        assert usage[0]["usage"]["completion_tokens"] == 3
        assert usage[0]["usage"]["prompt_tokens"] == 5
    else:
        assert usage == []
        assert all("usage" not in d for d in chunks)


async def test_chat_non_stream(sim: SimFactory) -> None:
    s = await sim()
    status, doc = await s.post("/v1/chat/completions", {**CHAT, "max_completion_tokens": 2})
    assert status == 200
    assert doc["object"] == "chat.completion"
    assert doc["id"].startswith("chatcmpl-")
    msg = doc["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"] == "the gateway"
    assert msg["tool_calls"] == []
    assert doc["choices"][0]["finish_reason"] == "length"
    # BOS, <user>, 4 text tokens, <end>, <assistant>: the template adds 4 tokens
    assert doc["usage"]["prompt_tokens"] == 8
    assert doc["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("include_usage", [True, False])
async def test_chat_stream(sim: SimFactory, include_usage: bool) -> None:
    s = await sim()
    body: dict[str, Any] = {**CHAT, "max_tokens": 3}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    out = await s.stream("/v1/chat/completions", body)
    data = out.data
    assert data[-1] == "[DONE]"
    assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = [d for d in data[1:-1] if d["choices"]]
    assert all(d["object"] == "chat.completion.chunk" for d in chunks)
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "the gateway routes"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    usage = [d for d in data[:-1] if not d["choices"]]
    assert len(usage) == (1 if include_usage else 0)
    if include_usage:
        assert usage[0]["usage"]["total_tokens"] == 8 + 3


async def test_responses_non_stream(sim: SimFactory) -> None:
    s = await sim()
    body = {**RESPONSES, "instructions": "be brief", "max_output_tokens": 3}
    status, doc = await s.post("/v1/responses", body)
    assert status == 200
    assert doc["object"] == "response" and doc["status"] == "completed"
    assert doc["id"].startswith("resp-")
    [item] = doc["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["content"][0] == {
        "type": "output_text",
        "text": "the gateway routes",
        "annotations": [],
    }
    usage = doc["usage"]
    assert usage["output_tokens"] == 3
    # BOS, "be brief" and "hello there" as system and user messages (role + end each),
    # then the assistant's role token
    assert usage["input_tokens"] == 1 + (3 + 2) + (4 + 2) + 1
    assert usage["total_tokens"] == usage["input_tokens"] + 3


async def test_responses_stream_event_sequence(sim: SimFactory) -> None:
    s = await sim()
    out = await s.stream("/v1/responses", {**RESPONSES, "max_output_tokens": 3})
    kinds = [name for name, _ in out.events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    data = out.data
    assert [d["type"] for d in data] == kinds
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert "".join(d["delta"] for d in data if d["type"].endswith(".delta")) == (
        "the gateway routes"
    )
    assert data[0]["response"]["status"] == "in_progress"
    done = data[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == "the gateway routes"
    assert done["usage"]["output_tokens"] == 3
    assert "[DONE]" not in data


async def test_tokenize_matches_usage_and_template(sim: SimFactory) -> None:
    s = await sim()
    text = "The quick brown fox jumps over the lazy dog"
    _, tok = await s.post("/tokenize", {"model": "sim-model", "prompt": text})
    _, again = await s.post("/tokenize", {"prompt": text})
    assert tok["tokens"] == again["tokens"]  # same text, same ids
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 32768
    _, doc = await s.post("/v1/completions", {"model": "sim-model", "prompt": text})
    assert doc["usage"]["prompt_tokens"] == tok["count"]
    _, plain = await s.post("/tokenize", {"prompt": text, "add_special_tokens": False})
    assert plain["tokens"] == tok["tokens"][1:]

    system = {"role": "system", "content": "You are a careful assistant for our shop."}
    a = [system, {"role": "user", "content": "where is my order"}]
    b = [system, {"role": "user", "content": "cancel it please"}]
    _, ta = await s.post("/tokenize", {"messages": a})
    _, tb = await s.post("/tokenize", {"messages": b})
    _, sys_ids = await s.post(
        "/tokenize", {"prompt": system["content"], "add_special_tokens": False}
    )
    shared = 1 + 1 + sys_ids["count"] + 1 + 1  # BOS, the system message, the user role token
    assert ta["tokens"][:shared] == tb["tokens"][:shared]
    assert ta["tokens"][shared] != tb["tokens"][shared]
    _, chat = await s.post("/v1/chat/completions", {"model": "sim-model", "messages": a})
    assert chat["usage"]["prompt_tokens"] == ta["count"]


async def test_prompt_as_token_ids(sim: SimFactory) -> None:
    s = await sim()
    status, doc = await s.post(
        "/v1/completions", {"model": "sim-model", "prompt": [5, 6, 7], "max_tokens": 1}
    )
    assert status == 200 and doc["usage"]["prompt_tokens"] == 3


async def test_context_length_and_bad_bodies_are_400(sim: SimFactory) -> None:
    s = await sim(max_model_len=64)
    status, doc = await s.post(
        "/v1/completions", {"model": "sim-model", "prompt": "x " * 60, "max_tokens": 10}
    )
    assert status == 400
    assert "maximum context length is 64 tokens" in doc["error"]["message"]
    status, _ = await s.post("/v1/chat/completions", {"model": "sim-model", "messages": []})
    assert status == 400
    async with s.http.post(f"{s.url}/v1/completions", data=b"{nope") as r:
        assert r.status == 400


async def test_stop_word_ends_with_stop(sim: SimFactory) -> None:
    s = await sim()
    _, doc = await s.post("/v1/completions", {**COMPLETION, "max_tokens": 8, "stop": ["to"]})
    assert doc["choices"][0]["text"] == "the gateway routes tokens"
    assert doc["choices"][0]["finish_reason"] == "stop"
    out = await s.stream("/v1/chat/completions", {**CHAT, "max_tokens": 8, "stop": "routes"})
    chunks = [d for d in out.data[1:-1] if d["choices"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "the gateway"


async def test_errors_and_every_answer_name_the_pod(sim: SimFactory) -> None:
    s = await sim(name="pod-x")
    s.pod.fail_status = 503
    async with s.http.post(f"{s.url}/v1/completions", json=COMPLETION) as r:
        assert r.status == 503
        assert r.headers["x-sim-pod"] == "pod-x"
        assert (await r.json())["error"]["message"] == "simulated failure on pod-x"
    s.pod.fail_status = None
    async with s.http.post(f"{s.url}/v1/completions", json=COMPLETION) as r:
        assert r.status == 200 and r.headers["x-sim-pod"] == "pod-x"


async def test_fault_control_sets_the_failure_knobs_over_http(sim: SimFactory) -> None:
    plain = await sim()
    async with plain.http.post(f"{plain.url}/sim/fault", json={"fail_status": 503}) as r:
        assert r.status == 404  # off unless asked for
    s = await sim(fault_control=True)
    async with s.http.post(f"{s.url}/sim/fault", json={"fail_status": 503}) as r:
        assert (await r.json())["fail_status"] == 503
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
    async with s.http.post(f"{s.url}/v1/completions", json=body) as r:
        assert r.status == 503
    async with s.http.post(f"{s.url}/sim/fault", json={"fail_status": "x"}) as r:
        assert r.status == 400
    async with s.http.post(f"{s.url}/sim/fault", json={"fail_status": None}) as r:
        assert (await r.json())["fail_status"] is None
    async with s.http.post(f"{s.url}/v1/completions", json=body) as r:
        assert r.status == 200
