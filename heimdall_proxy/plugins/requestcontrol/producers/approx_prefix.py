"""approx-prefix-cache-producer (llm-d's): the approximate prefix index, from the prompts this
gateway routed, and each request's match against it, which prefix-cache-scorer, the affinity
filter, no-hit-lru-scorer, the PD decider and the latency plugins read."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from pydantic import Field, model_validator

from heimdall_proxy.datalayer.vllm_metrics import CACHE_CONFIG
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inherit import changed
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    DICT_OR_MAPPING,
    CandidateNames,
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
    content_text,
)
from heimdall_proxy.kvcache.approx import ApproxPrefixIndex
from heimdall_proxy.kvcache.hashing import (
    block_keys,
    namespace_seed,
    text_block_keys,
    warn_if_python,
)
from heimdall_proxy.kvcache.index.redis import blob, unblob
from heimdall_proxy.plugins.scheduling.scorers.shared_state import (
    SharedJournalParams,
    SharesState,
    shared_journal,
)

APPROX_PREFIX_PRODUCER_TYPE = "approx-prefix-cache-producer"
#: Characters per token assumed when a request was not tokenized.
CHARS_PER_TOKEN = 4

log = logging.getLogger(__name__)


class ApproxPrefixProducerParams(SharedJournalParams):
    """llm-d's parameters and defaults (its README): the match covers up to 128K tokens.

    A seed config that puts these parameters on prefix-cache-scorer gets a producer made for
    it (config/defaults.py) with the seeds' defaults for that scorer where they differ:
    `maxPrefixBlocksToMatch` 256 and no token cap, so it routes as it did."""

    auto_tune: bool = True
    block_size_tokens: int = Field(default=16, gt=0)
    #: Deprecated: block size in characters.
    block_size: int = Field(default=0, ge=0)
    max_prefix_blocks_to_match: int = Field(default=2048, ge=0)
    #: llm-d's cap in tokens (maxBlocks = this / the block size), which takes precedence
    #: over maxPrefixBlocksToMatch when > 0; both 0 match the whole prompt.
    max_prefix_tokens_to_match: int = Field(default=131072, ge=0)
    lru_capacity_per_server: int = Field(default=31250, gt=0)

    def max_blocks(self, block_size: int) -> int | None:
        """How many blocks of `block_size` tokens a request's match may look up (None:
        the whole prompt)."""
        if self.max_prefix_tokens_to_match > 0:
            return max(1, self.max_prefix_tokens_to_match // block_size)
        return self.max_prefix_blocks_to_match or None

    @model_validator(mode="after")
    def _legacy_block_size(self) -> ApproxPrefixProducerParams:
        if self.block_size and "block_size_tokens" not in self.model_fields_set:
            raise ValueError(
                "blockSize (a block size in characters) is deprecated and cannot be used on its "
                f"own: set blockSizeTokens instead (blockSize {self.block_size} characters is "
                f"about {max(1, self.block_size // CHARS_PER_TOKEN)} tokens)"
            )
        return self


@dataclass(slots=True)
class _Hashes:
    """What produce() computed for one request, kept for pre_request."""

    block_size: int
    keys: list[int]


def request_text(request: InferenceRequest) -> str:
    """The text the approximate scorer chunks when a request carries no token ids. Chat
    messages are tagged with their role, so the same words said by different roles, or moved
    from one message to the next, do not look like the same prefix."""
    if request.api == "chat":
        messages = request.data.get("messages")
        if isinstance(messages, list):
            parts: list[str] = []
            for msg in messages:
                if isinstance(msg, DICT_OR_MAPPING):
                    parts.append(f"\x1e{msg.get('role', '')}\x1f")
                    content_text(msg.get("content"), parts, mark_media=True)
            return "".join(parts)
    return request.prompt_text()


def cache_salt(request: InferenceRequest) -> str | None:
    salt = request.data.get("cache_salt")
    return salt if isinstance(salt, str) and salt else None


def prompt_block_keys(request: InferenceRequest, block_size: int, limit: int | None) -> list[int]:
    """The chained block keys of a request's prompt, at most `limit` (None: all): of its
    token ids when a tokenizer left them, else of its text in blocks of `block_size * 4`
    characters. A prompt shorter than one block has none. The one block hashing of the
    approximate prefix producers (this one, burst-prefix-cache-producer)."""
    tokens = request.token_ids
    if tokens is not None:
        if len(tokens) < block_size:
            return []
        seed = namespace_seed(request.model, cache_salt(request))
        return block_keys(tokens, block_size, seed, max_blocks=limit)
    text = request_text(request)
    chars_per_block = block_size * CHARS_PER_TOKEN
    if len(text) < chars_per_block:
        return []
    seed = namespace_seed(request.model, cache_salt(request))
    return text_block_keys(text, chars_per_block, seed, max_blocks=limit)


@register(APPROX_PREFIX_PRODUCER_TYPE, ApproxPrefixProducerParams)
class ApproxPrefixCacheProducer(SharesState, BasePlugin[ApproxPrefixProducerParams]):
    """llm-d's approx-prefix-cache-producer, the one owner of an approximate prefix index.
    It approximates which pods hold a request's prompt prefix in their KV cache, from the
    prompts this gateway sent them, with no tokenizer and no KV events.

    The prompt is cut into blocks: `blockSizeTokens` tokens when a tokenizer prepare-data
    plugin left token ids on the request, else `blockSizeTokens * 4` characters (chat
    messages tagged with their role). Blocks get chained XXH3-64 keys seeded by the model
    name and the request's `cache_salt`, so a block's key stands for the whole prefix up to
    it, and prompts of different models or salts never match. Only full blocks count, at most
    `maxPrefixBlocksToMatch`; a prompt shorter than one block is scored 0 everywhere.

    Index: per pod, an LRU of the keys of the prompts routed to it (`lruCapacityPerServer`
    keys), updated in pre_request for the pod the request is sent to and, when a separate
    prefill pod ran, for it too. With `autoTune`, the block size follows each pod's
    `vllm:cache_config_info` `block_size` and its LRU capacity its `num_gpu_blocks`
    (the most common block size among the candidates is used for a request).
    The match caps (`maxPrefixTokensToMatch`, else `maxPrefixBlocksToMatch`) are not tuned: no
    vLLM metric carries the context length. (llm-d clamps a block size under 64 tokens up to
    64; not here: the pods' own block size, which autoTune reads, matches finer.)

    Runs as a Producer, so the match is on the CycleState before any scorer runs: under
    `prefix_match_key(type, name)` as a PrefixCacheMatchInfo, for the readers that name it
    (framework/prefix.py `prefix_match_reader`): prefix-cache-scorer
    (`prefixMatchInfoProducerName`), no-hit-lru-scorer, the affinity filter, prefill deciders,
    the latency plugins and inflight-load-producer. Two producers keep two indexes (e.g. two
    block sizes); the readers of one producer share its index.

    With `redisConfig` / `valkeyConfig` (an extension), replicas share the index: each keeps
    its own copy and reads it locally, and every index update is also journalled to the store
    and applied by the other replicas within about two `syncInterval`s; a replica that starts
    reads the journal's last `historyEntries` entries first (heimdall_proxy.replicas)."""

    type = APPROX_PREFIX_PRODUCER_TYPE
    #: The pods' block size and KV capacity (autoTune).
    metric_families = frozenset({CACHE_CONFIG})

    def __init__(self, name: str, params: ApproxPrefixProducerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        warn_if_python(log)
        if params.block_size and "block_size_tokens" in params.model_fields_set:
            log.warning(
                "plugin %r: blockSize is deprecated and ignored, blockSizeTokens=%d is used",
                name,
                params.block_size_tokens,
            )
        self.index = ApproxPrefixIndex(params.lru_capacity_per_server)
        self.state_key = prefix_match_key(self.type, name)
        self._hashes_key = f"{self.state_key}#hashes"
        #: (candidates, their number, Endpoint.block_size_generation, block size) last seen
        self._block_size_of: tuple[list[Endpoint] | None, int, int, int] = (None, 0, -1, 0)
        self.journal = shared_journal(self, params, self._apply)

    def inherit(self, previous: ApproxPrefixCacheProducer, gone: frozenset[str]) -> str | None:
        """A reload keeps the index, less the pods `gone`, while the keys keep their meaning
        (same block size and tuning); a new `lruCapacityPerServer` bounds each pod's keys
        from its next request on."""
        reason = changed(previous.params, self.params, "block_size_tokens", "auto_tune")
        if reason is not None:
            return f"the index starts empty: {reason}"
        for pod in gone:
            previous.index.forget(pod)
        self.index = previous.index
        self.hand_over(previous)
        return None

    def _apply(self, record: list[object]) -> None:
        """Another replica sent the blocks `keys` to `pod` (capacity as it saw it)."""
        if self.handed_over:
            return  # the successor applies it to the same index
        pod, capacity, keys = record
        if isinstance(pod, str) and isinstance(capacity, int) and isinstance(keys, bytes):
            self.index.add(pod, unblob(keys), capacity)

    # ---- the request path ----------------------------------------------------------------

    def _block_size(self, endpoints: list[Endpoint]) -> int:
        """The block size the pods report (the most common one), kept for a candidate list
        until a pod reports another: reading every pod's per request was a tenth of a
        decision at 1,024 pods."""
        seen, n, generation, size = self._block_size_of
        if (
            seen is endpoints
            and n == len(endpoints)
            and generation == Endpoint.block_size_generation
        ):
            return size
        size = self._read_block_size(endpoints)
        self._block_size_of = (endpoints, len(endpoints), Endpoint.block_size_generation, size)
        return size

    def _read_block_size(self, endpoints: list[Endpoint]) -> int:
        if self.params.auto_tune:
            first = endpoints[0].metrics.block_size if endpoints else 0
            if first:
                for e in endpoints:
                    if e.metrics.block_size != first:
                        break
                else:  # the usual pool: one block size, no Counter (nor set) per request
                    return first
            sizes = Counter(e.metrics.block_size for e in endpoints if e.metrics.block_size)
            if sizes:
                top = max(sizes.values())
                return min(size for size, n in sizes.items() if n == top)
        return self.params.block_size_tokens

    def _capacity(self, endpoint: Endpoint) -> int:
        if self.params.auto_tune and endpoint.metrics.num_gpu_blocks:
            return endpoint.metrics.num_gpu_blocks
        return self.params.lru_capacity_per_server

    def keys(self, request: InferenceRequest, block_size: int) -> list[int]:
        """The chained block keys of the request's prompt (at most maxPrefixBlocksToMatch).
        A prompt shorter than one block has none, and its namespace seed is not computed."""
        return prompt_block_keys(request, block_size, self.params.max_blocks(block_size))

    def match(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> PrefixCacheMatchInfo:
        """Compute (once per request) and publish the match of every candidate."""
        info = state.get(self.state_key)
        if isinstance(info, PrefixCacheMatchInfo):
            return info
        block_size = self._block_size(endpoints)
        keys = self.keys(request, block_size)
        prompt_tokens = request.estimated_tokens(CHARS_PER_TOKEN)
        if not keys:  # shorter than one block: nothing to look up, nothing to record
            info = PrefixCacheMatchInfo(block_size, 0, prompt_tokens, {}, keys)
            state[self.state_key] = info
            return info
        matched = self.index.match(keys, CandidateNames.of(endpoints).name_set())
        info = PrefixCacheMatchInfo(
            block_size,
            len(keys),
            prompt_tokens,
            {pod: float(n) for pod, n in matched.items()},
            keys,
        )
        state[self.state_key] = info
        state[self._hashes_key] = _Hashes(block_size, keys)
        return info

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        self.match(state, request, endpoints)

    async def pre_request(self, ctx: RequestContext) -> None:
        hashes = ctx.state.get(self._hashes_key)
        if not isinstance(hashes, _Hashes) or not hashes.keys:
            return
        for endpoint in (ctx.target, ctx.prefill):
            if endpoint is not None:
                capacity = self._capacity(endpoint)
                self.index.add(endpoint.name, hashes.keys, capacity)
                if self.journal is not None:
                    self.journal.append([endpoint.name, capacity, blob(hashes.keys)])
