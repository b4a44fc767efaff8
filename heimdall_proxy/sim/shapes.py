"""Response bodies and SSE events in the shapes vLLM's OpenAI server produces."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(doc: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(doc) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class Shapes:
    """Builds one response's bodies; ids and timestamps fixed per response."""

    def __init__(self, model: str, api: str) -> None:
        self.model = model
        self.api = api
        self.created = int(time.time())
        prefix = {
            "completions": "cmpl",
            "chat": "chatcmpl",
            "responses": "resp",
            "messages": "msg",
        }[api]
        self.id = _id(prefix)
        self.seq = 0

    # -- completions -------------------------------------------------------------------
    def completion(
        self,
        text: str,
        finish: str,
        prompt_tokens: int,
        n_tokens: int,
        cached: int = 0,
        **extra: Any,
    ) -> bytes:
        """A /v1/completions body; `extra` adds top-level fields (kv_transfer_params)."""
        return orjson.dumps(
            {
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage(prompt_tokens, n_tokens, cached),
                "kv_transfer_params": None,
                **extra,
            }
        )

    def completion_chunk(
        self, text: str, finish: str | None, running: dict[str, Any] | None = None
    ) -> bytes:
        """One streamed completion event; `running`: the usage so far, which vLLM puts in
        every event under `stream_options.continuous_usage_stats`."""
        doc: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            ],
        }
        if running is not None:
            doc["usage"] = running
        return sse(doc)

    # -- chat --------------------------------------------------------------------------
    def chat(
        self,
        text: str,
        finish: str,
        prompt_tokens: int,
        n_tokens: int,
        cached: int = 0,
        **extra: Any,
    ) -> bytes:
        """A /v1/chat/completions body; `extra` adds top-level fields (kv_transfer_params,
        ec_transfer_params)."""
        return orjson.dumps(
            {
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage(prompt_tokens, n_tokens, cached),
                "prompt_logprobs": None,
                "kv_transfer_params": None,
                **extra,
            }
        )

    def chat_chunk(
        self, delta: dict[str, Any], finish: str | None, running: dict[str, Any] | None = None
    ) -> bytes:
        """One streamed chat event; `running` as in `completion_chunk`."""
        doc: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if running is not None:
            doc["usage"] = running
        return sse(doc)

    def usage_chunk(self, prompt_tokens: int, n_tokens: int, cached: int = 0) -> bytes:
        obj = "chat.completion.chunk" if self.api == "chat" else "text_completion"
        return sse(
            {
                "id": self.id,
                "object": obj,
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(prompt_tokens, n_tokens, cached),
            }
        )

    # -- responses ---------------------------------------------------------------------
    def response_obj(
        self, status: str, text: str | None, prompt_tokens: int, n_tokens: int, cached: int = 0
    ) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if text is not None:
            output.append(self.message_item(text, "completed"))
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "temperature": 1.0,
            "top_p": 1.0,
            "usage": {
                "input_tokens": prompt_tokens,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": n_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt_tokens + n_tokens,
            }
            if status == "completed"
            else None,
        }

    def message_item(self, text: str, status: str) -> dict[str, Any]:
        return {
            "id": f"msg_{self.id}",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}]
            if status == "completed"
            else [],
        }

    def response_event(self, kind: str, **fields: Any) -> bytes:
        doc = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(doc, event=kind)

    # -- Anthropic messages ------------------------------------------------------------
    def message(
        self, text: str | None, stop_reason: str | None, prompt_tokens: int, n_tokens: int,
        cached: int = 0,
    ) -> dict[str, Any]:  # fmt: skip
        """A Messages API answer (`content` empty while streaming)."""
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [] if text is None else [{"type": "text", "text": text}],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt_tokens,
                "output_tokens": n_tokens,
                "cache_read_input_tokens": cached,
            },
        }

    def message_event(self, kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)
