"""The GIE metric set: TTFT for whole answers too, TPOT for streams, token counts from usage."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from heimdall_proxy.requesthandling.usage import NO_USAGE, body_usage, stream_usage, usage_counts
from tests.conftest import GatewayFactory, PodFactory, make_config

LABELS = {"model_name": "sim-model", "target_model_name": "sim-model"}


async def test_whole_and_streamed_answers_feed_ttft_tpot_and_token_counts(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    whole = {"model": "sim-model", "prompt": "one two three", "max_tokens": 4}
    streamed = {**whole, "stream": True, "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", json=whole) as r:
            usage = (await r.json())["usage"]
        async with http.post(f"{gw.url}/v1/completions", json=streamed) as r:
            assert r.status == 200
            await r.read()
    assert gw.metric("inference_objective_request_ttft_seconds_count", LABELS) == 2
    assert gw.metric("inference_objective_input_tokens_count", LABELS) == 2
    assert gw.metric("inference_objective_input_tokens_sum", LABELS) == 2 * usage["prompt_tokens"]
    assert gw.metric("inference_objective_output_tokens_sum", LABELS) == 8
    assert gw.metric("inference_objective_request_tpot_seconds_count", LABELS) == 1


def _usage_by_full_parse(body: bytes) -> tuple[int | None, int | None]:
    """The reference: parse the whole document, read `usage` (or `response.usage`)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return NO_USAGE
    if not isinstance(doc, dict):
        return NO_USAGE
    usage = doc.get("usage")
    if usage is None and isinstance(doc.get("response"), dict):
        usage = doc["response"].get("usage")
    return usage_counts(usage)


@pytest.mark.parametrize(
    "body",
    [
        b'{"id": "x", "choices": [{"text": "hi"}], "usage": {"prompt_tokens": 3, '
        b'"completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}}',
        # not the last key
        b'{"usage": {"prompt_tokens": 3, "completion_tokens": 5}, "model": "m"}',
        # nested only (a Responses API event): the tail is not a document, the whole is read
        b'{"type": "response.completed", "response": {"id": "r", "usage": '
        b'{"input_tokens": 2, "output_tokens": 7}}, "sequence_number": 9}',
        b'{"response": {"usage": {"input_tokens": 2, "output_tokens": 7}}}',
        # top-level null, the real one nested
        b'{"usage": null, "response": {"usage": {"input_tokens": 1, "output_tokens": 2}}}',
        # "usage" inside strings, as a value, escaped, or nested in a list
        b'{"choices": [{"text": "say \\"usage\\": {\\"prompt_tokens\\": 9}"}]}',
        b'{"choices": [{"text": "x\\"usage"}], "usage": {"completion_tokens": 4}}',
        b'{"type": "usage", "n": 1}',
        b'{"a": "usage"}',
        b'[{"usage": {"prompt_tokens": 1}}]',
        b'{"data": [{"usage": {"prompt_tokens": 1}}], "usage": {"prompt_tokens": 8}}',
        b'{"data": [{"usage": {"prompt_tokens": 1}}]}',
        # duplicate keys: the last wins either way
        b'{"usage": {"prompt_tokens": 1}, "usage": {"prompt_tokens": 2}}',
        # broken documents
        b'{"a": "x"usage": {"prompt_tokens": 1}}',
        b'{"choices": [], "usage": {"prompt_tokens": 1}',
        b'{ \n "usage" : {"prompt_tokens": 6, "completion_tokens": 1} }',
    ],
)
def test_usage_read_from_the_tail_agrees_with_a_full_parse(body: bytes) -> None:
    assert body_usage(body) == _usage_by_full_parse(body)


def test_usage_is_read_from_every_api_shape() -> None:
    assert body_usage(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 5}}') == (3, 5, None)
    assert body_usage(b'{"object": "response", "usage": {"input_tokens": 2, '
                      b'"output_tokens": 7}}') == (2, 7, None)  # fmt: skip
    assert body_usage(b'{"choices": []}') == (None, None, None)
    assert body_usage(b"not json") == (None, None, None)
    assert stream_usage(b'data: {"choices": [{"text": "a"}]}\n\n') is None
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}\n\n'
    assert stream_usage(usage + b"data: [DONE]\n\n") == (4, 3, None)
    assert stream_usage(b'data: {"usage": null}\n\n') is None


def test_cached_prompt_tokens_are_read_from_either_apis_details() -> None:
    chat = {
        "prompt_tokens": 9,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    responses = {
        "input_tokens": 9,
        "output_tokens": 1,
        "input_tokens_details": {"cached_tokens": 8},
    }
    assert usage_counts(chat) == (9, 1, 4)
    assert usage_counts(responses) == (9, 1, 8)


def test_responses_names_are_read_only_where_the_chat_names_are_absent() -> None:
    assert usage_counts({"input_tokens": 2, "output_tokens": 7}) == (2, 7, None)
    assert usage_counts({"prompt_tokens": 3, "input_tokens": 2, "completion_tokens": 5}) == (
        3,
        5,
        None,
    )
    # present but null is not absent: the Responses name is not consulted
    assert usage_counts({"prompt_tokens": None, "input_tokens": 2}) == (None, None, None)
    assert usage_counts({"completion_tokens": "5", "output_tokens": 7}) == (None, None, None)
    assert usage_counts([("prompt_tokens", 1)]) == (None, None, None)


async def test_a_stream_without_usage_is_asked_for_it_and_the_client_does_not_see_it(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    body = {"model": "sim-model", "prompt": "one two", "max_tokens": 3, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            text = (await r.read()).decode()
    assert pod.pod.received[-1].json()["stream_options"] == {"include_usage": True}
    assert '"usage"' not in text and text.rstrip().endswith("data: [DONE]")
    assert gw.metric("inference_objective_input_tokens_count", LABELS) == 1  # measured
    assert gw.metric("inference_objective_output_tokens_sum", LABELS) == 3


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_continuous_usage_stats_alone_gets_no_usage_as_from_vllm_alone(
    start_pod: PodFactory, start_gateway: GatewayFactory, api: str
) -> None:
    """vLLM sends usage in every event only when include_usage is on as well: a client that
    asked for continuous stats alone gets none, through the gateway too."""
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    options = {"continuous_usage_stats": True}
    body: dict[str, Any] = {"model": "sim-model", "max_tokens": 3, "stream": True}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "one two"}]
    else:
        body["prompt"] = "one two"
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    async with aiohttp.ClientSession() as http:
        async with http.post(pod.url + path, json={**body, "stream_options": options}) as r:
            assert '"usage"' not in (await r.read()).decode()  # the pod alone
        both = {**options, "include_usage": True}
        async with http.post(pod.url + path, json={**body, "stream_options": both}) as r:
            direct = (await r.read()).decode()
        assert direct.count('"usage"') > 2  # the simulator streams running usage as vLLM
        async with http.post(gw.url + path, json={**body, "stream_options": options}) as r:
            text = (await r.read()).decode()
    assert '"usage"' not in text and text.rstrip().endswith("data: [DONE]")
    assert gw.metric("inference_objective_output_tokens_sum", LABELS) == 3


def test_only_usage_only_events_are_stripped() -> None:
    from heimdall_proxy.requesthandling.usage import strip_usage_events

    chunk = (
        b'data: {"choices": [{"text": "a"}], "usage": null}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n'
        b"data: [DONE]\n\n"
    )
    out = strip_usage_events(chunk)
    assert b'"prompt_tokens"' not in out
    assert out.startswith(b'data: {"choices": [{"text": "a"}]') and b"data: [DONE]" in out
    assert strip_usage_events(b'data: {"choices": [{"text": "b"}]}\n\n') == (
        b'data: {"choices": [{"text": "b"}]}\n\n'
    )


def test_a_chunks_events_are_counted_once_without_done() -> None:
    """What the relay leaves on ctx.events for every streaming hook (they do not scan)."""
    from heimdall_proxy.requesthandling.usage import sse_events

    assert sse_events(b'data: {"a": 1}\n\ndata: {"b": 2}\n\n') == 2
    assert sse_events(b'data: {"a": 1}\n\ndata: [DONE]\n\n') == 1
    assert sse_events(b"data: [DONE]\n\n") == 0
    assert sse_events(b": keep-alive\n\n") == 0
