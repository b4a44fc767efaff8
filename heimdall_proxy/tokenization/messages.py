"""Anthropic Messages API requests as the chat requests vLLM makes of them, so the tokenizers
compute the prompt a pod's `/v1/messages` route computes.

vLLM serves `/v1/messages` by converting the body to a chat completion and rendering that
through the model's chat template (its Anthropic front end), so the prompt ids, and the KV
blocks a pod stores for them, are those of this conversion:

- `system` (a string, or text blocks joined with nothing between) becomes a first system
  message;
- a message's text blocks become its content: the text itself when there is one block, text
  parts otherwise; an image block becomes an image_url part with its source's data;
- tool_use blocks become the message's tool calls, their input as `json.dumps` writes it;
- a tool_result block in a user message becomes a tool message of its own, placed before the
  message that carried it, its content as Python's `str` writes it; in another role it is a
  text part "Tool result: ..."; thinking blocks become the message's reasoning;
- a message left with no content, tool call or reasoning is dropped;
- the tools become function tools (name, description, input_schema as parameters).

Until this existed the tokenizers could not read a Messages API body: the in-process one
took it for a completion without a prompt and failed, which counted against its circuit
breaker (a stream of Anthropic traffic could open it for every request)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["as_chat", "tokenizable"]


def tokenizable(api: str, data: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The API and body a tokenizer reads for a request: a Messages API request as its chat
    request (`as_chat`), any other as it is."""
    if api == "messages":
        return "chat", as_chat(data)
    return api, data


def as_chat(data: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion body vLLM's Anthropic front end makes of Messages API body `data`
    (the model, messages and tools: what the prompt is rendered from)."""
    messages: list[dict[str, Any]] = []
    system = data.get("system")
    if system:
        if isinstance(system, str):
            messages.append({"role": "system", "content": system})
        elif isinstance(system, list):
            text = "".join(
                b["text"]
                for b in system
                if isinstance(b, Mapping) and b.get("type") == "text" and _is_text(b.get("text"))
            )
            messages.append({"role": "system", "content": text})
    for msg in data.get("messages") or ():
        if isinstance(msg, Mapping):
            converted = _message(msg, messages)
            if converted is not None:
                messages.append(converted)
    out: dict[str, Any] = {"model": data.get("model"), "messages": messages}
    tools = data.get("tools")
    if isinstance(tools, list) and tools:
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description"),
                    "parameters": t.get("input_schema"),
                },
            }
            for t in tools
            if isinstance(t, Mapping)
        ]
    return out


def _message(msg: Mapping[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One message as a chat message (None: dropped); the tool messages its tool results make
    are appended to `messages` first."""
    role = msg.get("role")
    content = msg.get("content")
    out: dict[str, Any] = {"role": role}
    if isinstance(content, str):
        out["content"] = content
        return out
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and _is_text(block.get("text")):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            source = block["source"]
            url = source.get("data", "") if isinstance(source, Mapping) else ""
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(str(block["thinking"]))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            calls.append(
                {
                    "id": block.get("id") or "",
                    "type": "function",
                    "function": {"name": block.get("name") or "", "arguments": arguments},
                }
            )
        elif kind == "tool_result":
            result = block.get("content")
            text = str(result) if result else ""
            if role == "user":
                messages.append(
                    {"role": "tool", "tool_call_id": block.get("id") or "", "content": text}
                )
            else:
                parts.append({"type": "text", "text": f"Tool result: {text}"})
    if reasoning:
        out["reasoning"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    if parts:
        one_text = len(parts) == 1 and parts[0]["type"] == "text"
        out["content"] = parts[0]["text"] if one_text else parts
    elif not calls and not reasoning:
        return None
    return out


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)
