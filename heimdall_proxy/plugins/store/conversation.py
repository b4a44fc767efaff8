"""The Responses API bits responses-store needs: input items, one stored turn's part of a
conversation, the ids of listed input items, and the final response of an SSE
stream."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

#: Stream events that carry the final response object.
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TERMINAL_MARKERS = tuple(t.encode() for t in TERMINAL_EVENTS)


def input_items(value: Any) -> list[Any]:
    """A request's `input` as a list of items: a string is one user message; None is none."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    return [value]


def turn_items(entry: dict[str, Any]) -> list[Any]:
    """One stored turn's part of a conversation: the input it added, then what it produced
    (OpenAI's semantics for `previous_response_id`; instructions are not part of it, so they
    do not carry over). An entry without a link holds its whole history as its input."""
    response = entry.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    own = entry.get("input")
    return [
        *(own if isinstance(own, list) else []),
        *(output if isinstance(output, list) else []),
    ]


def listed_items(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as `GET /v1/responses/{id}/input_items` shows them: messages with list
    content (`input_text` parts, `output_text` for the assistant's) and an `id` on every
    item. An item without an id gets one derived from the conversation up to and including
    it, so the same item keeps its id in every later response of that conversation."""
    digest = hashlib.blake2b(digest_size=12)
    out: list[dict[str, Any]] = []
    for item in items:
        digest.update(orjson.dumps(item, option=orjson.OPT_SORT_KEYS))
        doc: dict[str, Any] = dict(item) if isinstance(item, dict) else {"content": item}
        if "content" in doc and doc.get("type", "message") == "message":
            doc["type"] = "message"
            role = doc.setdefault("role", "user")
            if isinstance(doc["content"], str):
                part = "output_text" if role == "assistant" else "input_text"
                doc["content"] = [{"type": part, "text": doc["content"]}]
        if not isinstance(doc.get("id"), str):
            doc["id"] = f"msg_{digest.hexdigest()}"
        out.append(doc)
    return out


class FinalResponseParser:
    """Follows a Responses API SSE stream chunk by chunk (events may be split anywhere) and
    keeps the response object of its terminal event (`response.completed`, or
    `response.incomplete` / `response.failed`). Only events that mention a terminal type are
    decoded. Buffers at most `max_event_bytes` of an unfinished event: past that the final
    response could not be stored anyway, and `overflowed` is set."""

    __slots__ = ("_tail", "final", "max_event_bytes", "overflowed")

    def __init__(self, max_event_bytes: int) -> None:
        self._tail = b""
        self.final: dict[str, Any] | None = None
        self.max_event_bytes = max_event_bytes
        self.overflowed = False

    def feed(self, chunk: bytes) -> dict[str, Any] | None:
        """Returns the final response when this chunk completed its event, else None."""
        if self.final is not None or self.overflowed:
            return None
        data = self._tail + chunk
        if b"\r" in data:
            # a CR at the very end may be half of a CRLF split across chunks
            held = data.endswith(b"\r")
            data = data[:-1] if held else data
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                data += b"\r"
        events = data.split(b"\n\n")
        self._tail = events.pop()
        if len(self._tail) > self.max_event_bytes:
            self.overflowed = True
            self._tail = b""
        for event in events:
            if any(marker in event for marker in _TERMINAL_MARKERS):
                final = _terminal_response(event)
                if final is not None:
                    self.final = final
                    self._tail = b""
                    return final
        return None


class BodyCollector:
    """Collects a JSON body the gateway relayed in chunks (an upstream that sent no
    Content-Length), up to `max_bytes`; past that `overflowed` is set and nothing is kept."""

    __slots__ = ("_chunks", "_size", "max_bytes", "overflowed")

    def __init__(self, max_bytes: int) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self.max_bytes = max_bytes
        self.overflowed = False

    def feed(self, chunk: bytes) -> None:
        if self.overflowed:
            return
        self._size += len(chunk)
        if self._size > self.max_bytes:
            self.overflowed = True
            self._chunks.clear()
        else:
            self._chunks.append(chunk)

    def body(self) -> bytes:
        return b"".join(self._chunks)


def _terminal_response(event: bytes) -> dict[str, Any] | None:
    lines = [
        line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    ]
    if not lines:
        return None
    try:
        doc = orjson.loads(b"\n".join(lines))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("type") not in TERMINAL_EVENTS:
        return None
    response = doc.get("response")
    if isinstance(response, dict) and isinstance(response.get("id"), str):
        return response
    return None
