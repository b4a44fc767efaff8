"""tokenizer: prepare-data plugin that leaves the prompt's token ids on the request."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint, InferenceRequest
from heimdall_proxy.resilience.breaker import CircuitBreaker
from heimdall_proxy.tokenization import (
    DEFAULT_MAX_PROMPT_CHARS,
    InProcessTokenizer,
    LocalTokenizer,
    RequestTokenizer,
    TokenizeSkippedError,
)
from heimdall_proxy.tokenization.incremental import DEFAULT_CACHE_BYTES
from heimdall_proxy.tokenization.resolve import TokenizerNotFoundError, find_tokenizer
from heimdall_proxy.tokenization.uds import UDSTokenizerClient

TOKENIZER_TYPE = "tokenizer"
PREPARE_DATA_GATE = "prepareDataPlugins"
DEFAULT_SOCKET = "/tmp/tokenizer/tokenizer-uds.socket"

log = logging.getLogger(__name__)


class UDSTokenizerConfig(PluginParams):
    socket_file: str = DEFAULT_SOCKET


class TokenizerParams(PluginParams):
    model_name: str = Field(min_length=1)
    uds_tokenizer_config: UDSTokenizerConfig | None = None
    #: Extension: prompts longer than this (characters) go on untokenized.
    max_prompt_chars: int = Field(default=DEFAULT_MAX_PROMPT_CHARS, gt=0)
    #: Extension: bytes of recent chat prompts (text and token ids) kept so a conversation's
    #: next turn tokenizes only its new text (tokenization/incremental.py); 0: none.
    conversation_cache_bytes: int = Field(default=DEFAULT_CACHE_BYTES, ge=0)


def uds_tokenizer(socket_file: str, model: str, max_prompt_chars: int) -> RequestTokenizer:
    """The tokenizer service on `socket_file` (llm-d's sidecar protocol), for `model`."""
    return UDSTokenizerClient(socket_file, model, timeout=1.0, max_prompt_chars=max_prompt_chars)


def local_tokenizer(
    model: str,
    max_prompt_chars: int,
    hint: str = "",
    conversation_cache_bytes: int = DEFAULT_CACHE_BYTES,
) -> RequestTokenizer:
    """`model`'s own tokenizer, in-process on a worker thread. Raises ValueError (a config
    error, followed by `hint`) when no tokenizer file can be found for it."""
    try:
        path = find_tokenizer(model)
    except TokenizerNotFoundError as exc:
        raise ValueError(f"{exc}{hint}") from exc
    return InProcessTokenizer(
        LocalTokenizer(path, conversation_cache_bytes), max_prompt_chars=max_prompt_chars
    )


class Tokenizing:
    """The request path of a plugin that sets `InferenceRequest.token_ids` with a
    RequestTokenizer (`tokenizer`, `token-producer`): once per request, before scheduling,
    failing open behind a circuit breaker. Set `name`, `tokenizer` (None: nothing to do) and
    `breaker` in __init__; `estimates` when the ids it sets are made up (they then never
    replace ids already there, while real ids replace made-up ones)."""

    name: str
    tokenizer: RequestTokenizer | None
    breaker: CircuitBreaker
    failures: int = 0
    skipped: int = 0
    estimates: bool = False

    def breakers(self) -> Iterable[CircuitBreaker]:
        return (self.breaker,)

    async def prepare_data(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        tokenizer = self.tokenizer
        if tokenizer is None or request.api not in ("completions", "chat", "responses", "messages"):
            return
        if request.token_ids is not None and (self.estimates or not request.token_ids_estimated):
            return
        if not self.breaker.allow():
            return  # the tokenizer is failing: go on untokenized at once
        try:
            request.token_ids = await tokenizer.tokenize(
                request.api, request.data, len(request.body)
            )
            request.token_ids_estimated = self.estimates
            self.breaker.success()
        except TokenizeSkippedError as exc:
            self.skipped += 1
            log.debug(
                "tokenizer %r: request goes on untokenized: %s",
                self.name,
                exc,
                extra={"request_id": request.request_id},
            )
        except Exception as exc:
            self.breaker.failure()
            self.failures += 1
            log.warning(
                "tokenizer %r: request goes on untokenized: %s",
                self.name,
                exc,
                extra={"request_id": request.request_id},
            )

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        if self.tokenizer is not None:
            await self.tokenizer.close()


@register(TOKENIZER_TYPE, TokenizerParams, feature_gate=PREPARE_DATA_GATE)
class TokenizerPlugin(Tokenizing, BasePlugin[TokenizerParams]):
    """Tokenizes completions, chat, responses and Anthropic Messages API requests once, before
    scheduling, and sets `InferenceRequest.token_ids` for every later plugin (prefix-cache
    scorers, deciders). A Messages API request is read as the chat request vLLM's
    /v1/messages front end makes of it (tokenization/messages.py).

    In-process by default: `modelName`'s tokenizer.json is found locally (the model name as a
    path, `/mnt/models/<modelName>/`, the Hugging Face hub cache, else the Hub: downloaded)
    and run on a worker thread; chat requests are first rendered with the model's chat
    template, as vLLM renders them. With `udsTokenizerConfig`, requests go to the tokenizer
    service on `socketFile` instead (`heimdall-proxy tokenizer-server`).

    Fails open: a request that cannot be tokenized (service down, no chat template, odd
    input) goes on without token ids, with a warning. A request that already carries token
    ids is left alone. A missing local tokenizer is a configuration error.

    Bounded (an extension): a prompt over `maxPromptChars` characters (default 1 MiB, about
    256k tokens) is not tokenized, nor, in-process, a request that arrives while the worker
    has 4 x `maxPromptChars` characters of prompts queued; both go on without token ids at
    once, counted in `skipped` and logged at debug level (not failures: the breaker is not
    told). Later plugins then estimate the prompt's tokens from its characters.

    Incremental (an extension): in-process, a chat request whose conversation was tokenized
    before tokenizes only its new text, with the same ids; `conversationCacheBytes` (default
    64 MiB) bounds the prompts kept for that (0: none)."""

    type = TOKENIZER_TYPE

    def __init__(self, name: str, params: TokenizerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.failures = 0
        self.skipped = 0
        self.breaker = CircuitBreaker(f"{name}: tokenizer")
        if params.uds_tokenizer_config is not None:
            self.tokenizer = uds_tokenizer(
                params.uds_tokenizer_config.socket_file, params.model_name, params.max_prompt_chars
            )
        else:
            self.tokenizer = local_tokenizer(
                params.model_name,
                params.max_prompt_chars,
                conversation_cache_bytes=params.conversation_cache_bytes,
            )
