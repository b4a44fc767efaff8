"""precise-prefix-cache-scorer's parameters: the reference's names and defaults (extensions
are marked), and the checks that need more than one field."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from heimdall_proxy.framework.params import Duration, HashSeed, PluginParams
from heimdall_proxy.kvcache.hashing import STANDARD_HASH_SEED
from heimdall_proxy.kvcache.index import parse_bytes, tier_weights
from heimdall_proxy.kvcache.prepare import default_processes
from heimdall_proxy.plugins.scheduling.scorers.shared_state import RedisConfig
from heimdall_proxy.tokenization import DEFAULT_MAX_PROMPT_CHARS
from heimdall_proxy.tokenization.incremental import DEFAULT_CACHE_BYTES


class TokenProcessorConfig(PluginParams):
    block_size: int = Field(default=16, gt=0)
    #: llm-d's seed of the block-key chain: accepted, not honoured (warned about). Keys here
    #: are seeded by the model (or adapter) and cache_salt, the same on the event and the
    #: request side, so a seed would change key values but never which blocks match.
    hash_seed: str = ""


class InMemoryConfig(PluginParams):
    size: int = Field(default=100_000_000, gt=0)
    pod_cache_size: int = Field(default=10, gt=0)


class CostAwareMemoryConfig(PluginParams):
    size: str | int = "2GiB"

    @field_validator("size")
    @classmethod
    def _size(cls, value: str | int) -> str | int:
        parse_bytes(value)
        return value


class ConductorConfig(PluginParams):
    """Extension: ask a KV cache indexer service (kvcache.index.conductor) instead of
    following the pods' events here."""

    url: str = Field(min_length=1)
    hash_seed: HashSeed = STANDARD_HASH_SEED
    tenant_id: str = "default"
    cache_salt: str = ""
    timeout: Duration = 0.5


class KVBlockIndexConfig(PluginParams):
    in_memory_config: InMemoryConfig | None = None
    cost_aware_memory_config: CostAwareMemoryConfig | None = None
    redis_config: RedisConfig | None = None
    valkey_config: RedisConfig | None = None
    conductor_config: ConductorConfig | None = None
    enable_metrics: bool = False
    metrics_logging_interval: Duration = 0.0

    @model_validator(mode="after")
    def _one_backend(self) -> KVBlockIndexConfig:
        chosen = [
            name
            for name, value in (
                ("inMemoryConfig", self.in_memory_config),
                ("costAwareMemoryConfig", self.cost_aware_memory_config),
                ("redisConfig", self.redis_config),
                ("valkeyConfig", self.valkey_config),
                ("conductorConfig", self.conductor_config),
            )
            if value is not None
        ]
        if len(chosen) > 1:
            raise ValueError(
                f"configure exactly one index backend, got {len(chosen)}: {', '.join(chosen)}"
            )
        return self


class HFTokenizerConfig(PluginParams):
    enabled: bool = True
    hugging_face_token: str = ""
    tokenizers_cache_dir: str = "bin"
    tokenizer: str = ""
    tokenizer_mode: str = "auto"
    tokenizer_revision: str = ""


class LocalTokenizerConfig(PluginParams):
    auto_discovery_dir: str = "/mnt/models"
    auto_discovery_tokenizer_file_name: str = "tokenizer.json"
    model_tokenizer_map: dict[str, str] = Field(default_factory=dict)
    tokenizer: str = ""
    tokenizer_mode: str = "auto"
    tokenizer_revision: str = ""


class UDSTokenizerPoolConfig(PluginParams):
    socket_file: str = "/tmp/tokenizer/tokenizer-uds.socket"
    use_tcp: bool = Field(default=False, alias="useTCP")
    model_tokenizer_map: dict[str, str] = Field(default_factory=dict)


class TokenizersPoolConfig(PluginParams):
    model_name: str = Field(min_length=1)
    workers_count: int = Field(default=5, gt=0)
    #: Extension: prompts longer than this (characters) are not tokenized (score 0).
    max_prompt_chars: int = Field(default=DEFAULT_MAX_PROMPT_CHARS, gt=0)
    #: Extension: bytes of recent chat prompts (text and token ids) kept so a conversation's
    #: next turn tokenizes only its new text (tokenization/incremental.py); 0: none.
    conversation_cache_bytes: int = Field(default=DEFAULT_CACHE_BYTES, ge=0)
    hf: HFTokenizerConfig | None = None
    local: LocalTokenizerConfig | None = None
    uds: UDSTokenizerPoolConfig | None = None


class IndexerConfig(PluginParams):
    kv_block_index_config: KVBlockIndexConfig = Field(default_factory=KVBlockIndexConfig)
    #: Required on precise-prefix-cache-scorer (it tokenizes); precise-prefix-cache-producer
    #: reads a token-producer's ids instead.
    tokenizers_pool_config: TokenizersPoolConfig | None = None


class PodDiscoveryConfig(PluginParams):
    pod_namespace: str = ""
    socket_port: int = Field(default=5557, gt=0, lt=65536)


class KVEventsConfig(PluginParams):
    zmq_endpoint: str = ""
    topic_filter: str = "kv@"
    concurrency: int = Field(default=4, gt=0)
    discover_pods: bool = True
    pod_discovery_config: PodDiscoveryConfig = Field(default_factory=PodDiscoveryConfig)
    #: Extension: the replay ROUTER is at the publisher's port + this (0: no replay).
    replay_port_offset: int = Field(default=1, ge=0)
    #: Extension: how long to wait for a replay answer.
    replay_timeout: Duration = 1.0
    #: Extension: on start (and for each pod that joins) ask the pod's replay socket for
    #: every batch it still buffers, so a restarted gateway's index is not empty; start-up
    #: waits at most `catchUpWait` for it.
    catch_up_on_start: bool = True
    catch_up_wait: Duration = 5.0
    #: Extension: worker processes that decode batches and hash their tokens (0: on the
    #: event loop); by default one when the machine has more than one CPU.
    decode_processes: int = Field(default_factory=default_processes, ge=0)


class PrecisePrefixCacheParams(PluginParams):
    token_processor_config: TokenProcessorConfig = Field(default_factory=TokenProcessorConfig)
    indexer_config: IndexerConfig
    kv_events_config: KVEventsConfig = Field(default_factory=KVEventsConfig)
    speculative_indexing: bool = False
    speculative_ttl: Duration = Field(default=2.0, alias="speculativeTTL")
    #: Extension: the weight of a block held only in a slower tier (gpu, cpu, disk).
    tier_weights: dict[str, float] = Field(default_factory=dict)

    #: Whether the plugin tokenizes itself, and so needs indexerConfig.tokenizersPoolConfig.
    TOKENIZES: ClassVar[bool] = True

    @field_validator("tier_weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        tier_weights(value)
        return value

    @model_validator(mode="after")
    def _pool(self) -> PrecisePrefixCacheParams:
        if self.TOKENIZES and self.indexer_config.tokenizers_pool_config is None:
            raise ValueError("indexerConfig.tokenizersPoolConfig is required")
        return self


class PrecisePrefixProducerParams(PrecisePrefixCacheParams):
    """llm-d's precise-prefix-cache-producer: the scorer's parameters, with indexerConfig
    optional; token ids come from a token-producer."""

    TOKENIZES: ClassVar[bool] = False
    indexer_config: IndexerConfig = Field(default_factory=IndexerConfig)


# ---- building blocks -----------------------------------------------------------------------


#: Tokenizer modes implemented here: auto and hf read tokenizer.json with `tokenizers` (as
#: vLLM's fast tokenizer), mistral encodes with `mistral-common` (tokenization.mistral).
#: The reference's other modes (slow, deepseek_v32) are config errors: vLLM implements them
#: with code no maintained library offers outside it, and other ids would mis-key blocks.
TOKENIZER_MODES = ("auto", "hf", "mistral")


def tokenizer_mode(pool: TokenizersPoolConfig) -> str:
    """The pool's tokenizer mode: "mistral" when `hf` or `local` asks for it, else "default"
    (auto or hf: tokenizer.json). Raises ValueError naming a mode that is not implemented,
    or mistral in one section and hf in the other (auto defers to the other)."""
    chosen: set[str] = set()
    for where, cfg in (("hf", pool.hf), ("local", pool.local)):
        if cfg is None:
            continue
        if cfg.tokenizer_mode not in TOKENIZER_MODES:
            raise ValueError(
                f"indexerConfig.tokenizersPoolConfig.{where}.tokenizerMode "
                f"{cfg.tokenizer_mode!r} is not supported (supported: "
                f"{', '.join(TOKENIZER_MODES)}): its token ids would not match the pods'"
            )
        chosen.add(cfg.tokenizer_mode)
    if {"mistral", "hf"} <= chosen:
        raise ValueError(
            "indexerConfig.tokenizersPoolConfig: hf.tokenizerMode and local.tokenizerMode "
            "disagree (mistral and hf): set one mode"
        )
    return "mistral" if "mistral" in chosen else "default"


def unhonoured(params: PrecisePrefixCacheParams) -> list[str]:
    """The reference's parameters this plugin accepts but does not act on, as set in
    `params` (each is warned about once at start-up). Raises ValueError for a tokenizer mode
    no library here implements, which would silently give wrong token ids."""
    out: list[str] = []
    if params.token_processor_config.hash_seed:
        out.append("tokenProcessorConfig.hashSeed (keys are seeded by the model and "
                   "cache_salt alike on both sides; a seed changes no match)")  # fmt: skip
    idx = params.indexer_config
    pool = idx.tokenizers_pool_config
    if pool is not None:
        tokenizer_mode(pool)
    base = "indexerConfig.tokenizersPoolConfig"
    if pool is not None and pool.local is not None and pool.local.tokenizer_revision:
        out.append(f"{base}.local.tokenizerRevision (a local directory has one revision)")
    kv = idx.kv_block_index_config
    for name, rc in (("redisConfig", kv.redis_config), ("valkeyConfig", kv.valkey_config)):
        if rc is not None and rc.enable_rdma:
            out.append(f"indexerConfig.kvBlockIndexConfig.{name}.enableRDMA (TCP is used)")
    if kv.conductor_config is not None:
        if params.speculative_indexing:
            out.append("speculativeIndexing (the conductor learns blocks from events only)")
        if "kv_events_config" in params.model_fields_set:
            out.append("kvEventsConfig (with conductorConfig the conductor follows the events)")
    if params.kv_events_config.pod_discovery_config.pod_namespace:
        out.append("kvEventsConfig.podDiscoveryConfig.podNamespace (pods come from the "
                   "gateway's pool: its endpoints list and discovery.kubernetes, whose "
                   "namespace applies)")  # fmt: skip
    return out
