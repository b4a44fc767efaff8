"""A tokenizer-free stand-in for token ids: the prompt's bytes packed four to a made-up token.

llm-d's token-producer falls back to this (its `estimate` backend) when no model server or
tokenizer is configured. Four bytes a token is the same rate every reader here uses to
estimate a prompt from its characters, so a block of N made-up tokens covers as many bytes
as an N-token block of text would, and counts (context length, in-flight tokens) stay
sensible. The ids mean nothing to a model: two prompts that share a byte prefix share an id
prefix, which is all an approximate prefix index needs, but they never match an engine's KV
blocks, so the precise index ignores them (InferenceRequest.token_ids_estimated).

What is packed, per API (our rule; llm-d's is close but not the same):
- completions: the prompt string (of a batch, the first, as the other tokenizers here do);
  a prompt sent as token ids is passed on as the real ids it is (`given_ids`).
- chat: the JSON of `tools` when given, then each message's role and its text; a media part
  (image, audio, video) is one token from a hash of its URL or data, aligned on a token
  boundary, so prompts that differ only in an image do not look alike. llm-d's per-image and
  per-video placeholder counts (`estimate.image`, `estimate.video`) are not modelled.
- responses: `instructions`, then the JSON of `tools` when given, then `input` (its text
  when a string, else its JSON).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping
from typing import Any

import orjson
import xxhash

from heimdall_proxy.tokenization import (
    DEFAULT_MAX_PROMPT_CHARS,
    TokenizeSkippedError,
    check_prompt_length,
)
from heimdall_proxy.tokenization.local import completion_prompt, prompt_chars
from heimdall_proxy.tokenization.messages import tokenizable

BYTES_PER_TOKEN = 4
_MEDIA_KEYS = ("image_url", "input_image", "input_audio", "audio_url", "video_url")


def pack_bytes(raw: bytes) -> list[int]:
    """Little-endian uint32 tokens of `raw`, the tail zero-padded to a whole token."""
    pad = -len(raw) % BYTES_PER_TOKEN
    if pad:
        raw += b"\x00" * pad
    tokens = array("I")  # 4 bytes on every platform CPython supports
    tokens.frombytes(raw)
    if sys.byteorder == "big":
        tokens.byteswap()
    return tokens.tolist()


def _align(out: bytearray) -> None:
    pad = -len(out) % BYTES_PER_TOKEN
    if pad:
        out += b"\x00" * pad


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _media_token(part: Mapping[str, Any]) -> bytes:
    """One token standing for a media part: a hash of what identifies the asset."""
    ident = b""
    for key in _MEDIA_KEYS:
        value = part.get(key)
        if value is not None:
            ident = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
            break
    return xxhash.xxh3_64_intdigest(ident).to_bytes(8, "little")[:BYTES_PER_TOKEN]


def _chat_bytes(data: Mapping[str, Any]) -> bytes:
    out = bytearray()
    tools = data.get("tools")
    if tools:
        out += orjson.dumps(tools)
    messages = data.get("messages")
    if not isinstance(messages, list):
        return bytes(out)
    for msg in messages:
        if not isinstance(msg, Mapping):
            continue
        role = _text(msg.get("role"))
        if role:
            out += role.encode()
        content = msg.get("content")
        if isinstance(content, str):
            out += content.encode()
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, str):
                    out += part.encode()
                elif isinstance(part, Mapping):
                    text = _text(part.get("text"))
                    if text is not None:
                        out += text.encode()
                    else:
                        _align(out)
                        out += _media_token(part)
    return bytes(out)


def given_ids(api: str, data: Mapping[str, Any]) -> list[int] | None:
    """The token ids a completions request was sent as (of a batch, the first), else None:
    real ids, which need no estimate."""
    if api != "completions":
        return None
    try:
        prompt = completion_prompt(data)
    except ValueError:
        return None
    return prompt if isinstance(prompt, list) else None


def _completion_bytes(data: Mapping[str, Any]) -> bytes:
    try:
        prompt = completion_prompt(data)
    except ValueError as exc:
        raise TokenizeSkippedError(str(exc)) from exc
    if not isinstance(prompt, str):
        raise TokenizeSkippedError("the prompt is token ids, not text")
    return prompt.encode()


def _responses_bytes(data: Mapping[str, Any]) -> bytes:
    out = bytearray()
    instructions = _text(data.get("instructions"))
    if instructions:
        out += instructions.encode()
    tools = data.get("tools")
    if tools:
        out += orjson.dumps(tools)
    inp = data.get("input")
    if isinstance(inp, str):
        out += inp.encode()
    elif inp is not None:
        out += orjson.dumps(inp)
    return bytes(out)


def estimate_bytes(api: str, data: Mapping[str, Any]) -> bytes:
    """The bytes the estimate packs for a request (module docstring); TokenizeSkippedError
    for an API or prompt shape it has no rule for."""
    if api == "chat":
        return _chat_bytes(data)
    if api == "completions":
        return _completion_bytes(data)
    if api == "responses":
        return _responses_bytes(data)
    raise TokenizeSkippedError(f"no estimate for {api!r} requests")


class EstimateTokenizer:
    """A RequestTokenizer that makes up ids from the prompt's bytes (module docstring).
    In-process and cheap (one pass over the prompt); bounded by `max_prompt_chars` like the
    real tokenizers."""

    def __init__(self, max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS) -> None:
        self.max_prompt_chars = max_prompt_chars

    async def tokenize(self, api: str, data: Mapping[str, Any], size_hint: int = 0) -> list[int]:
        api, data = tokenizable(api, data)
        check_prompt_length(prompt_chars(api, data), self.max_prompt_chars)
        return pack_bytes(estimate_bytes(api, data))

    async def close(self) -> None:
        return None
