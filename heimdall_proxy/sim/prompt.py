"""The simulator's own reading of a request's prompt text, as vLLM's OpenAI server reads it.

Written apart from the gateway's extraction (framework.types) on purpose: the simulator
stands in for vLLM, so a bug in the gateway's reading shows up as a mismatch in the tests
instead of being shared by both sides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import orjson

#: The routes the simulator serves: OpenAI's, Anthropic's Messages ("other": anything else
#: under /v1).
ApiKind = Literal["completions", "chat", "responses", "messages", "other"]


def _parts_text(content: Any) -> list[str]:
    """Text of a message `content`: the string itself, or the string parts and the `text` of
    the dict parts of a list (media parts carry no text)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return texts


def content_text(content: Any) -> str:
    """The concatenated text of one message content."""
    return "".join(_parts_text(content))


def prompt_text(api: ApiKind, data: Mapping[str, Any]) -> str:
    """Everything the prompt says, concatenated: the messages' contents (chat), the prompt
    string or list of strings (completions), or the instructions and input (responses)."""
    texts: list[str] = []
    if api == "completions":
        prompt = data.get("prompt")
        if isinstance(prompt, str):
            texts.append(prompt)
        elif isinstance(prompt, list):
            texts.extend(p for p in prompt if isinstance(p, str))
    elif api == "chat":
        for msg in data.get("messages") or ():
            if isinstance(msg, Mapping):
                texts.extend(_parts_text(msg.get("content")))
    elif api == "responses":
        if isinstance(data.get("instructions"), str):
            texts.append(data["instructions"])
        inp = data.get("input")
        if isinstance(inp, str):
            texts.append(inp)
        elif isinstance(inp, list):
            for item in inp:
                if not isinstance(item, Mapping):
                    continue
                texts.extend(_parts_text(item.get("content")))
                if item.get("type") == "input_text" and isinstance(item.get("text"), str):
                    texts.append(item["text"])
    return "".join(texts)


def anthropic_chat(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Messages API request as chat messages, as vLLM's Anthropic front end renders it
    through the chat template: `system` first, then each message's text, tool calls (their
    name and input as JSON) and tool results."""
    out: list[dict[str, Any]] = []
    system = data.get("system")
    if system is not None:
        out.append({"role": "system", "content": "".join(_anthropic_text(system))})
    for msg in data.get("messages") or ():
        if isinstance(msg, Mapping):
            role = msg.get("role", "user")
            out.append({"role": role, "content": "".join(_anthropic_text(msg.get("content")))})
    return out


def _anthropic_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_result":
            texts.extend(_anthropic_text(block.get("content")))
        elif block.get("type") == "tool_use":
            texts.append(f"{block.get('name', '')}({orjson.dumps(block.get('input')).decode()})")
    return texts
