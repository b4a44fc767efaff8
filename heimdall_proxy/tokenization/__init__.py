"""Tokenizing OpenAI requests as vLLM does: in-process (Hugging Face `tokenizers`, chat
templates with Jinja) or through a tokenizer service on a Unix socket."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from heimdall_proxy.tokenization.local import LocalTokenizer, prompt_chars
from heimdall_proxy.tokenization.messages import tokenizable

#: Requests whose body and prompt are smaller than this are tokenized on the event loop: a
#: thread hop costs more than tokenizing a short prompt.
INLINE_BYTES = 4096
#: Prompts longer than this many characters are not tokenized (the request goes on without
#: token ids, as when tokenizing fails): about 256k tokens, beyond most models' context,
#: which the pod refuses anyway; tokenizing them cost seconds of a core for nothing.
DEFAULT_MAX_PROMPT_CHARS = 1 << 20
#: The prompt characters that may wait for or be in the tokenizer's threads, in multiples of
#: the longest prompt tokenized: beyond it requests go on untokenized at once rather than
#: wait behind the work already queued.
PENDING_PROMPTS = 4


class TokenizeSkippedError(Exception):
    """The request was deliberately not tokenized (its prompt is too long, or the tokenizer
    has as much work queued as it may): it goes on without token ids. Not a tokenizer
    failure: it counts towards no circuit breaker."""


class RequestTokenizer(Protocol):
    """Turns an OpenAI (or Anthropic Messages API) request body into the prompt token ids
    vLLM would compute."""

    async def tokenize(self, api: str, data: Mapping[str, Any], size_hint: int = 0) -> list[int]:
        """`size_hint`: the body's size in bytes, when known (small ones may run inline). A
        Messages API body is read as the chat request vLLM makes of it (messages.py).
        Raises TokenizeSkippedError for a request it will not tokenize."""
        ...

    async def close(self) -> None: ...


class PromptTokenizer(Protocol):
    """An in-process tokenizer of OpenAI request bodies (LocalTokenizer, or the mistral
    mode's MistralRequestTokenizer)."""

    def tokenize_request(self, api: str, data: Mapping[str, Any]) -> list[int]: ...


def check_prompt_length(chars: int, limit: int) -> None:
    """TokenizeSkippedError when a prompt of `chars` characters is over `limit`."""
    if chars > limit:
        raise TokenizeSkippedError(
            f"the prompt has {chars} characters, over maxPromptChars ({limit}): not tokenized"
        )


class InProcessTokenizer:
    """A PromptTokenizer behind a pool of `workers` threads, so long prompts and chat
    templates do not stall the event loop (LocalTokenizer's encoding releases the GIL).

    Bounded: a prompt over `max_prompt_chars` characters is not tokenized, and while the
    prompts waiting for or in the threads add up to `max_pending_chars` (default
    PENDING_PROMPTS x `max_prompt_chars`), a request that would go over is not either; both
    raise TokenizeSkippedError at once."""

    def __init__(
        self,
        tokenizer: PromptTokenizer,
        workers: int = 1,
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
        max_pending_chars: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_chars = max_prompt_chars
        self.max_pending_chars = (
            PENDING_PROMPTS * max_prompt_chars if max_pending_chars is None else max_pending_chars
        )
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tokenize")
        #: Prompt characters submitted to the pool and not done (a cancelled request's work
        #: still counts until its thread is done with it), and how many prompts; updated
        #: from the worker threads too.
        self._lock = threading.Lock()
        self.pending_chars = 0
        self.pending = 0

    async def tokenize(self, api: str, data: Mapping[str, Any], size_hint: int = 0) -> list[int]:
        api, data = tokenizable(api, data)
        chars = prompt_chars(api, data)
        check_prompt_length(chars, self.max_prompt_chars)
        if 0 < size_hint < INLINE_BYTES and chars < INLINE_BYTES:
            return self.tokenizer.tokenize_request(api, data)
        with self._lock:
            if self.pending and self.pending_chars + chars > self.max_pending_chars:
                raise TokenizeSkippedError(
                    f"the tokenizer has {self.pending} prompts ({self.pending_chars} "
                    "characters) queued: not tokenized"
                )
            self.pending += 1
            self.pending_chars += chars
        try:
            future = self._pool.submit(self.tokenizer.tokenize_request, api, data)
        except BaseException:
            self._done(chars)
            raise
        future.add_done_callback(lambda _: self._done(chars))
        # cancelling the request cancels the work if it has not started
        return await asyncio.wrap_future(future)

    def _done(self, chars: int) -> None:
        with self._lock:
            self.pending -= 1
            self.pending_chars -= chars

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "DEFAULT_MAX_PROMPT_CHARS",
    "INLINE_BYTES",
    "InProcessTokenizer",
    "LocalTokenizer",
    "PromptTokenizer",
    "RequestTokenizer",
    "TokenizeSkippedError",
    "check_prompt_length",
]
