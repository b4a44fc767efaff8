"""token-producer (llm-d's): the prompt's token ids, once per request, for every plugin that
reads them (the prefix producers, context-length-aware, the PD decider).

Backends, as llm-d selects them:
- `vllm` (`url`, `timeout` 5s, `mmTimeout` 30s): vLLM's render routes
  (tokenization/render.py): the ids the engine itself will prefill, chat template included.
  `modelName` fills a request's `model` when it has none.
- `udsTokenizerConfig` (deprecated in llm-d, warned about): the tokenizer sidecar over a Unix
  socket (tokenization/uds.py).
- `modelName` alone: here the model's own tokenizer in-process (as the `tokenizer` plugin
  loads it: a local tokenizer.json, the Hugging Face cache or Hub). llm-d sends that case to
  vLLM's render at localhost:8000, which beside this gateway is the gateway itself.
- none (llm-d's `estimate`, the default): ids made up from the prompt's bytes, four to a
  token (tokenization/estimate.py), marked as estimated. They serve counting and the
  approximate prefix index; the precise index ignores them (they never match an engine's KV
  blocks), as llm-d's precise path misses on them. The `estimate` image and video settings
  are accepted and warned about: a media part counts as one made-up token here.

Runs in the prepare-data phase, before every producer, and is idempotent: a request that
already carries ids (a completion sent as ids, or an earlier tokenizer) is left alone, but
for made-up ones, which a real backend replaces. Fails
open behind a circuit breaker, bounded by `maxPromptChars` (an extension, as on
`tokenizer`)."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import Duration, PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint, InferenceRequest
from heimdall_proxy.plugins.requestcontrol.producers.tokenizer import (
    Tokenizing,
    UDSTokenizerConfig,
    local_tokenizer,
    uds_tokenizer,
)
from heimdall_proxy.resilience.breaker import CircuitBreaker
from heimdall_proxy.tokenization import DEFAULT_MAX_PROMPT_CHARS
from heimdall_proxy.tokenization.estimate import EstimateTokenizer, given_ids
from heimdall_proxy.tokenization.incremental import DEFAULT_CACHE_BYTES
from heimdall_proxy.tokenization.render import VLLMRenderTokenizer

TOKEN_PRODUCER_TYPE = "token-producer"
DEFAULT_RENDER_URL = "http://localhost:8000"

log = logging.getLogger(__name__)


class VLLMRenderConfig(PluginParams):
    url: str = DEFAULT_RENDER_URL
    timeout: Duration = Field(default=5.0, gt=0)
    mm_timeout: Duration = Field(default=30.0, gt=0)


class TokenProducerParams(PluginParams):
    model_name: str = ""
    vllm: VLLMRenderConfig | None = None
    uds_tokenizer_config: UDSTokenizerConfig | None = None
    #: llm-d's estimate backend settings (image and video placeholder counts): accepted,
    #: not honoured (warned about; a media part is one made-up token).
    estimate: dict[str, Any] | None = None
    #: Extension: prompts longer than this (characters) go on untokenized.
    max_prompt_chars: int = Field(default=DEFAULT_MAX_PROMPT_CHARS, gt=0)
    #: Extension (`modelName` alone, in-process): bytes of recent chat prompts (text and
    #: token ids) kept so a conversation's next turn tokenizes only its new text
    #: (tokenization/incremental.py); 0: none.
    conversation_cache_bytes: int = Field(default=DEFAULT_CACHE_BYTES, ge=0)


@register(TOKEN_PRODUCER_TYPE, TokenProducerParams)
class TokenProducer(Tokenizing, BasePlugin[TokenProducerParams]):
    """Sets `InferenceRequest.token_ids` from the configured backend (module docstring)."""

    type = TOKEN_PRODUCER_TYPE

    def __init__(self, name: str, params: TokenProducerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.failures = 0
        self.skipped = 0
        self.breaker = CircuitBreaker(f"{name}: token-producer")
        if params.estimate:
            log.warning(
                "plugin %r: estimate settings %s are accepted but not honoured (the estimate "
                "here makes one token of each image, audio or video)",
                name,
                sorted(params.estimate),
            )
        if params.vllm is not None:
            v = params.vllm
            self.backend = "vllm"
            self.tokenizer = VLLMRenderTokenizer(
                v.url, params.model_name, v.timeout, v.mm_timeout, params.max_prompt_chars
            )
        elif params.uds_tokenizer_config is not None:
            log.warning(
                "plugin %r: udsTokenizerConfig is deprecated (as in llm-d): prefer `vllm.url`, "
                "vLLM's render routes",
                name,
            )
            if not params.model_name:
                raise ValueError("udsTokenizerConfig needs modelName")
            self.backend = "uds"
            self.tokenizer = uds_tokenizer(
                params.uds_tokenizer_config.socket_file, params.model_name, params.max_prompt_chars
            )
        elif params.model_name:
            self.backend = "local"
            self.tokenizer = local_tokenizer(
                params.model_name,
                params.max_prompt_chars,
                " (or give `vllm.url`, a vLLM that renders prompts for this model)",
                params.conversation_cache_bytes,
            )
        else:
            self.backend = "estimate"
            self.estimates = True
            self.tokenizer = EstimateTokenizer(params.max_prompt_chars)

    async def prepare_data(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        if self.estimates and request.token_ids is None:
            ids = given_ids(request.api, request.data)
            if ids is not None:  # the client sent real ids: nothing to estimate
                request.token_ids = ids
                return
        await super().prepare_data(request, endpoints)
