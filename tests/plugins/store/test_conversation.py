"""The Responses API helpers of responses-store: input items, continued input, listed ids,
and the final response of an SSE stream split anywhere."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from heimdall_proxy.plugins.store.conversation import (
    FinalResponseParser,
    input_items,
    listed_items,
    turn_items,
)


def sse(doc: dict[str, Any], crlf: bool = False) -> bytes:
    text = f"event: {doc['type']}\ndata: ".encode() + orjson.dumps(doc) + b"\n\n"
    return text.replace(b"\n", b"\r\n") if crlf else text


RESPONSE = {"id": "resp-1", "object": "response", "status": "completed", "output": []}
STREAM = [
    {"type": "response.created", "response": {**RESPONSE, "status": "in_progress"}},
    # a delta that mentions a terminal event type in its text must not fool the parser
    {"type": "response.output_text.delta", "delta": 'say "response.completed"'},
    {"type": "response.completed", "response": RESPONSE},
]


def test_input_items() -> None:
    assert input_items(None) == []
    assert input_items("hi") == [{"type": "message", "role": "user", "content": "hi"}]
    items = [{"role": "user", "content": "x"}]
    assert input_items(items) == items and input_items(items) is not items


def test_turn_items_are_the_turns_input_then_its_output() -> None:
    out = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    entry = {"response": {"output": [out]}, "input": [{"role": "user", "content": "a"}]}
    assert turn_items(entry) == [{"role": "user", "content": "a"}, out]
    assert turn_items({"response": {}, "input": []}) == []
    assert turn_items({"response": "junk", "input": "junk"}) == []


def test_listed_items_shapes_and_stable_ids() -> None:
    first = [{"type": "message", "role": "user", "content": "a"}]
    out = {"id": "msg_out", "type": "message", "role": "assistant", "content": "b"}
    later = [*first, out, {"role": "user", "content": [{"type": "input_text", "text": "c"}]}]
    listed = listed_items(later)
    assert listed[0]["content"] == [{"type": "input_text", "text": "a"}]
    assert listed[1]["id"] == "msg_out"
    assert listed[1]["content"] == [{"type": "output_text", "text": "b"}]
    assert listed[2]["type"] == "message"
    assert len({item["id"] for item in listed}) == 3
    assert listed_items(first)[0]["id"] == listed[0]["id"]
    # the same message in another conversation (another prefix) gets another id
    other = listed_items([{"role": "user", "content": "z"}, *first])
    assert other[1]["id"] != listed[0]["id"]


@pytest.mark.parametrize("crlf", [False, True])
def test_parser_finds_final_response_at_any_split(crlf: bool) -> None:
    data = b"".join(sse(doc, crlf) for doc in STREAM)
    for cut in range(1, len(data)):
        parser = FinalResponseParser(10_000)
        assert parser.feed(data[:cut]) is None or cut >= len(data) - 2
        got = parser.final or parser.feed(data[cut:])
        assert got == RESPONSE, cut


def test_parser_byte_by_byte_and_other_terminal_events() -> None:
    incomplete = {**RESPONSE, "status": "incomplete"}
    data = sse(STREAM[0]) + sse({"type": "response.incomplete", "response": incomplete})
    parser = FinalResponseParser(10_000)
    results = [parser.feed(data[i : i + 1]) for i in range(len(data))]
    assert [r for r in results if r is not None] == [incomplete]
    assert parser.feed(sse(STREAM[2])) is None  # the first terminal event wins


def test_parser_gives_up_on_an_event_over_its_limit() -> None:
    big = {"type": "response.completed", "response": {**RESPONSE, "pad": "x" * 5000}}
    parser = FinalResponseParser(1000)
    data = sse(big)
    for i in range(0, len(data), 512):
        assert parser.feed(data[i : i + 512]) is None
    assert parser.overflowed and parser.final is None


def test_parser_ignores_events_without_a_response_object() -> None:
    parser = FinalResponseParser(10_000)
    assert parser.feed(b"data: {not json response.completed}\n\n") is None
    assert parser.feed(sse({"type": "response.completed"})) is None
    assert parser.feed(b": comment response.failed\n\n") is None
    assert parser.feed(sse(STREAM[2])) == RESPONSE
