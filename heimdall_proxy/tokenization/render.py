"""vLLM's render endpoints as a tokenizer: the prompt ids the model server itself computes.

vLLM serves `POST /v1/completions/render` and `/v1/chat/completions/render` (with
`--enable-scale-out`, or `vllm launch render` as a tokenizer-only sidecar): the request body
of the matching OpenAI route in, the rendered prompt out as GenerateRequest objects whose
`token_ids` are what the engine would prefill (chat: one object, the chat template applied;
completions: a list, one per prompt). llm-d's token-producer `vllm` backend calls the same
routes, so one sidecar serves both.

A Responses request has no render route; it is rendered as the chat request it amounts to.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from heimdall_proxy.tokenization import (
    DEFAULT_MAX_PROMPT_CHARS,
    TokenizeSkippedError,
    check_prompt_length,
)
from heimdall_proxy.tokenization.local import prompt_chars, responses_messages
from heimdall_proxy.tokenization.messages import tokenizable

log = logging.getLogger(__name__)

#: Content part types that make a chat request multimodal (the longer timeout applies).
MEDIA_PARTS = frozenset({"image_url", "input_image", "input_audio", "audio_url", "video_url"})


class RenderError(Exception):
    """The render endpoint failed or answered something that is not a rendered prompt."""


def is_multimodal(data: Mapping[str, Any]) -> bool:
    messages = data.get("messages")
    if not isinstance(messages, list):
        return False
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in MEDIA_PARTS:
                    return True
    return False


class VLLMRenderTokenizer:
    """A RequestTokenizer over HTTP to vLLM's render routes at `url`. `timeout` bounds a
    text-only request, `mm_timeout` one with images, audio or video (seconds)."""

    def __init__(
        self,
        url: str,
        model: str = "",
        timeout: float = 5.0,
        mm_timeout: float = 30.0,
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.mm_timeout = aiohttp.ClientTimeout(total=mm_timeout)
        self.max_prompt_chars = max_prompt_chars
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def tokenize(self, api: str, data: Mapping[str, Any], size_hint: int = 0) -> list[int]:
        api, data = tokenizable(api, data)
        check_prompt_length(prompt_chars(api, data), self.max_prompt_chars)
        if api == "completions":
            path = "/v1/completions/render"
            body: dict[str, Any] = dict(data)
        elif api == "chat":
            path = "/v1/chat/completions/render"
            body = dict(data)
        elif api == "responses":
            path = "/v1/chat/completions/render"
            body = {"model": data.get("model"), "messages": responses_messages(data)}
        else:
            raise TokenizeSkippedError(f"no render route for {api} requests")
        if self.model and not body.get("model"):
            body["model"] = self.model
        body.pop("stream", None)
        body.pop("stream_options", None)
        timeout = self.mm_timeout if is_multimodal(body) else self.timeout
        try:
            async with self._client().post(
                self.url + path,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=timeout,
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RenderError(f"{path} answered {resp.status}: {raw[:200]!r}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RenderError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from exc
        return token_ids_of(orjson.loads(raw))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def token_ids_of(rendered: Any) -> list[int]:
    """The ids of a render answer: one GenerateRequest object, or a list of them of which
    the first prompt's are taken (a request here carries one prompt)."""
    first = rendered[0] if isinstance(rendered, list) and rendered else rendered
    ids = first.get("token_ids") if isinstance(first, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise RenderError("the render answer carries no token_ids")
    return ids
