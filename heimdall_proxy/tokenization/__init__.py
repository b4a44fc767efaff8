"""Tokenizing OpenAI requests as vLLM does: in-process (Hugging Face `tokenizers`, chat
templates with Jinja) or through a tokenizer service on a Unix socket."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from heimdall_proxy.tokenization.local import LocalTokenizer

#: Requests whose body is smaller than this are tokenized on the event loop: a thread hop
#: costs more than tokenizing a short prompt.
INLINE_BYTES = 4096


class RequestTokenizer(Protocol):
    """Turns an OpenAI request body into the prompt token ids vLLM would compute."""

    async def tokenize(self, api: str, data: Mapping[str, Any], size_hint: int = 0) -> list[int]:
        """`size_hint`: the body's size in bytes, when known (small ones may run inline)."""
        ...

    async def close(self) -> None: ...


class PromptTokenizer(Protocol):
    """An in-process tokenizer of OpenAI request bodies (LocalTokenizer, or the mistral
    mode's MistralRequestTokenizer)."""

    def tokenize_request(self, api: str, data: Mapping[str, Any]) -> list[int]: ...


class InProcessTokenizer:
    """A PromptTokenizer behind a pool of `workers` threads, so long prompts and chat
    templates do not stall the event loop."""

    def __init__(self, tokenizer: PromptTokenizer, workers: int = 1) -> None:
        self.tokenizer = tokenizer
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tokenize")

    async def tokenize(self, api: str, data: Mapping[str, Any], size_hint: int = 0) -> list[int]:
        if 0 < size_hint < INLINE_BYTES:
            return self.tokenizer.tokenize_request(api, data)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.tokenizer.tokenize_request, api, data)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "INLINE_BYTES",
    "InProcessTokenizer",
    "LocalTokenizer",
    "PromptTokenizer",
    "RequestTokenizer",
]
