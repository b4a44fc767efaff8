"""anthropic-parser: Anthropic's Messages API (`/v1/messages`, and `/v1/messages/count_tokens`,
which is routed on its model and whose answer is not read), as vLLM serves it to coding
agents.

A request's prompt is its `system` and its messages' blocks (text, tool calls and results:
framework/types.py `anthropic_content_text`), so prefix-aware routing works on agent
conversations as on chat. Usage: a whole answer's `usage` (`input_tokens`,
`output_tokens`, `cache_read_input_tokens`); a stream tells the prompt's in its
`message_start` event and the output's in `message_delta` (a running total, the last one
final)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import InferenceRequest, Usage
from heimdall_proxy.requesthandling.parse import invalid, json_object
from heimdall_proxy.requesthandling.usage import counts_under

ANTHROPIC_PARSER_TYPE = "anthropic-parser"
MESSAGES = "messages"
COUNT_TOKENS = "messages/count_tokens"


def _usage(doc: Any) -> Usage | None:
    return counts_under(doc, "input_tokens", "output_tokens", "cache_read_input_tokens")


@register(ANTHROPIC_PARSER_TYPE, NoParams)
class AnthropicParser(BasePlugin[NoParams]):
    type = ANTHROPIC_PARSER_TYPE
    claims = (MESSAGES, COUNT_TOKENS)
    route_prefix = "/v1/"

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
        data = json_object(body)
        model = data.get("model")
        if not isinstance(model, str) or not model:
            raise invalid("model", "model: a model name (string) is required")
        if path.rstrip("/").endswith(COUNT_TOKENS):
            return InferenceRequest(
                api="count_tokens", path=path, model=model, body=body, data=data, headers=headers
            )
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise invalid("messages", "messages: at least one message is required")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise invalid(f"messages.{i}", f"messages.{i}: a message must be an object")
        max_tokens = data.get("max_tokens")
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise invalid("max_tokens", "max_tokens: a positive integer is required")
        stream = data.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise invalid("stream", "stream: a boolean is required")
        return InferenceRequest(
            api="messages",
            path=path,
            model=model,
            body=body,
            data=data,
            headers=headers,
            stream=stream is True,
            parser=self,
        )

    def body_usage(self, body: bytes) -> Usage | None:
        at = body.rfind(b'"usage"')
        if at < 0:
            return None
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return _usage(doc.get("usage")) if isinstance(doc, dict) else None

    def chunk_usage(self, chunk: bytes) -> Usage | None:
        if b'"usage"' not in chunk:
            return None
        found: Usage | None = None
        for line in chunk.split(b"\n"):
            if not line.startswith(b"data:") or b'"usage"' not in line:
                continue
            try:
                event = orjson.loads(line[5:].strip())
            except orjson.JSONDecodeError:
                continue  # an event split across chunks: its usage comes whole later
            if not isinstance(event, dict):
                continue
            kind = event.get("type")
            if kind == "message_start" and isinstance(event.get("message"), dict):
                usage = _usage(event["message"].get("usage"))
                # the output count here is the first token's, not the answer's
                usage = usage._replace(output=None) if usage is not None else None
            elif kind == "message_delta":
                usage = _usage(event.get("usage"))
            else:
                continue
            if usage is not None:
                found = usage if found is None else _merge(found, usage)
        return found


def _merge(old: Usage, new: Usage) -> Usage:
    return Usage(
        new.prompt if new.prompt is not None else old.prompt,
        new.output if new.output is not None else old.output,
        new.cached if new.cached is not None else old.cached,
    )
