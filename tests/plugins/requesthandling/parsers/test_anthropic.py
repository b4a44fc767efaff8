"""anthropic-parser: Messages requests read for routing (prompt text from system, text,
tool calls and results), count_tokens routed on its model, and usage from whole answers and
from streams (prompt in message_start, output in message_delta, cached reads), including an
event split across chunks."""

from __future__ import annotations

import orjson
import pytest

from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import Usage
from heimdall_proxy.plugins.requesthandling.parsers.anthropic import AnthropicParser
from tests.plugins.helpers import ledger

PARSER = AnthropicParser("anthropic-parser", NoParams(), ledger())


def parse(doc: object, path: str = "/v1/messages") -> object:
    return PARSER.parse_request(path, orjson.dumps(doc), {})


def test_a_conversation_is_read_as_its_prompt_text() -> None:
    req = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "stream": True,
            "system": [{"type": "text", "text": "You are terse. "}],
            "messages": [
                {"role": "user", "content": "List files."},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "ls", "input": {"dir": "."}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "a.py b.py"}]},
            ],
        }
    )  # fmt: skip
    assert req.api == "messages" and req.model == "m" and req.stream  # type: ignore[attr-defined]
    text = req.prompt_text()  # type: ignore[attr-defined]
    assert text.startswith("You are terse. List files.")
    assert '{"dir":"."}' in text and text.endswith("a.py b.py")
    assert req.parser is PARSER  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "max_tokens": 8, "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages.0"),
        ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
         "max_tokens"),
        ({"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]},
         "stream"),
    ],
)  # fmt: skip
def test_bad_requests_name_their_field(doc: dict[str, object], param: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(doc)
    assert info.value.status == 400 and info.value.param == param


def test_count_tokens_is_routed_by_model_and_its_answer_not_read() -> None:
    req = parse({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                "/v1/messages/count_tokens")  # fmt: skip
    assert req.api == "count_tokens" and req.model == "m"  # type: ignore[attr-defined]
    assert req.parser is None  # type: ignore[attr-defined]


def test_usage_of_a_whole_answer() -> None:
    body = orjson.dumps({"type": "message", "content": [], "usage": {
        "input_tokens": 12, "output_tokens": 5, "cache_read_input_tokens": 8}})  # fmt: skip
    assert PARSER.body_usage(body) == Usage(12, 5, 8)
    assert PARSER.body_usage(b'{"type": "message"}') is None


def event(kind: str, **fields: object) -> bytes:
    return (
        f"event: {kind}\n".encode() + b"data: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"
    )


def test_usage_of_a_stream_comes_from_its_start_and_its_last_delta() -> None:
    start = event("message_start", message={"usage": {
        "input_tokens": 30, "output_tokens": 1, "cache_read_input_tokens": 16}})  # fmt: skip
    # the start's output count is the first token's, not the answer's
    assert PARSER.chunk_usage(start) == Usage(30, None, 16)
    text = event("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"})
    assert PARSER.chunk_usage(text) is None
    delta = event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 7})
    assert PARSER.chunk_usage(delta + event("message_stop")) == Usage(None, 7, None)
    assert PARSER.chunk_usage(start + text + delta) == Usage(30, 7, 16)  # one chunk, all of it
    assert PARSER.chunk_usage(delta[: len(delta) // 2]) is None  # split: read when whole
