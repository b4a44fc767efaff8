"""The llm-d tokenizer protocol's values and chat messages <-> Python's, and what the
client (uds.py) and the server (uds_server.py) of the protocol share."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2 as pb

log = logging.getLogger(__name__)

#: Messages up to this size both ways (long prompts; the llm-d client allows the same).
MAX_MESSAGE = 100 * 1024 * 1024


class TokenizerServiceError(RuntimeError):
    """The tokenizer service answered with an error, or could not be reached in time."""


# ---- JSON-like values <-> the protocol's Value ------------------------------------------


def to_value(value: Any) -> pb.Value:
    """A JSON-like Python value as a protocol Value (None: a Value with nothing set)."""
    if isinstance(value, bool):
        return pb.Value(bool_value=value)
    if isinstance(value, int | float):
        return pb.Value(number_value=float(value))
    if isinstance(value, str):
        return pb.Value(string_value=value)
    if isinstance(value, Mapping):
        return pb.Value(struct_value=pb.StructValue(fields=to_value_map(value)))
    if isinstance(value, list | tuple):
        return pb.Value(list_value=pb.ListValue(values=[to_value(v) for v in value]))
    if value is None:
        return pb.Value()
    raise ValueError(f"cannot send a {type(value).__name__} in a template argument")


def to_value_map(values: Mapping[str, Any]) -> dict[str, pb.Value]:
    return {str(k): to_value(v) for k, v in values.items()}


def from_value(value: pb.Value) -> Any:
    """A protocol Value as Python; whole numbers come back as int (JSON has one number
    type, templates print 1 and 1.0 differently)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        n = value.number_value
        return int(n) if n.is_integer() and abs(n) < 2**53 else n
    if kind == "bool_value":
        return value.bool_value
    if kind == "list_value":
        return [from_value(v) for v in value.list_value.values]
    if kind == "struct_value":
        return from_value_map(value.struct_value.fields)
    return None


def from_value_map(values: Mapping[str, pb.Value]) -> dict[str, Any]:
    return {k: from_value(v) for k, v in values.items()}


# ---- chat messages <-> the protocol's ChatMessage ----------------------------------------


def to_chat_message(message: Mapping[str, Any]) -> pb.ChatMessage:
    """An OpenAI chat message as a protocol message. Content parts other than text and
    image_url have no place in the protocol and are left out (as the llm-d client does)."""
    role = message.get("role")
    if not isinstance(role, str):
        raise ValueError("a chat message needs a string role")
    out = pb.ChatMessage(role=role)
    content = message.get("content")
    if isinstance(content, str):
        out.content = content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                out.content_parts.append(pb.ContentPart(type="text", text=part))
            elif not isinstance(part, Mapping):
                raise ValueError("a content part must be an object")
            elif isinstance(part.get("text"), str):
                out.content_parts.append(pb.ContentPart(type="text", text=part["text"]))
            elif part.get("type") == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, Mapping) else image
                if isinstance(url, str):
                    out.content_parts.append(
                        pb.ContentPart(type="image_url", image_url=pb.ImageUrl(url=url))
                    )
    elif content is not None:
        raise ValueError("a message's content must be a string or a list of parts")
    calls = message.get("tool_calls")
    if calls:
        out.tool_calls_json = json.dumps(calls)
    return out


def from_chat_message(message: pb.ChatMessage) -> dict[str, Any]:
    """A protocol message as the OpenAI chat message it stands for."""
    out: dict[str, Any] = {"role": message.role}
    if message.content_parts:
        parts: list[dict[str, Any]] = []
        for part in message.content_parts:
            if part.HasField("image_url"):
                parts.append({"type": part.type, "image_url": {"url": part.image_url.url}})
            else:
                parts.append({"type": part.type or "text", "text": part.text})
        out["content"] = parts
    else:
        out["content"] = message.content if message.HasField("content") else None
    if message.HasField("tool_calls_json") and message.tool_calls_json:
        out["tool_calls"] = json.loads(message.tool_calls_json)
    return out


class WarnOnce:
    """Logs a warning the first time each kind of thing (`what`) happens, after a fixed
    prefix. Called from worker threads too: a set add is atomic enough, and a rare second
    warning is harmless."""

    __slots__ = ("_prefix", "_seen")

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._seen: set[str] = set()

    def __call__(self, what: str, message: str) -> None:
        if what not in self._seen:
            self._seen.add(what)
            log.warning("%s: %s", self._prefix, message)
