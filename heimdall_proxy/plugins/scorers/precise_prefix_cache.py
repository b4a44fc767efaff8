"""precise-prefix-cache-scorer: prefix-cache affinity from the pods' own KV-cache events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily
from pydantic import Field, field_validator, model_validator

from heimdall_proxy.breaker import CircuitBreaker
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import Duration, PluginParams
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.kvcache.hashing import STANDARD_HASH_SEED, LazyBlockKeys, salt_root
from heimdall_proxy.kvcache.index import (
    CostAwareMemoryIndex,
    InMemoryIndex,
    KVBlockIndex,
    KVCacheStats,
    parse_bytes,
    tier_weights,
)
from heimdall_proxy.kvcache.index.conductor import ConductorClient
from heimdall_proxy.kvcache.index.redis import RedisIndex
from heimdall_proxy.kvcache.ingest import KVEventIngest
from heimdall_proxy.kvcache.prepare import (
    cached_seed,
    default_processes,
)
from heimdall_proxy.kvcache.subscriber import SubscriberOptions
from heimdall_proxy.loopmetrics import HistogramFamily
from heimdall_proxy.plugins.scorers.prefix_cache import cache_salt
from heimdall_proxy.plugins.scorers.shared_state import RedisConfig
from heimdall_proxy.tokenization import InProcessTokenizer, RequestTokenizer
from heimdall_proxy.tokenization.local import LocalTokenizer
from heimdall_proxy.tokenization.mistral import (
    TEKKEN_FILE,
    MistralRequestTokenizer,
    download_mistral_tokenizer,
    mistral_file,
)
from heimdall_proxy.tokenization.resolve import (
    TOKENIZER_FILE,
    HFCacheSearch,
    LocalSearch,
    TokenizerNotFoundError,
    find_tokenizer,
)
from heimdall_proxy.tokenization.uds import UDSTokenizerClient, uds_model_name

PRECISE_PREFIX_CACHE_SCORER_TYPE = "precise-prefix-cache-scorer"

#: Lookup latency buckets: Prometheus' defaults (llm-d's indexer uses them), with finer ones
#: below 5 ms, where lookups fall.
_LOOKUP_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: KVCacheStats fields exported as heimdall_kvcache_feed_total{kind}: the event feed's
#: health (the llm-d families cover admissions, evictions and lookups).
_FEED_KINDS = (
    "batches", "gaps", "missed_batches", "replayed_batches", "publisher_restarts",
    "decode_errors", "unknown_events", "invalid_events", "orphan_events", "unknown_removals",
    "block_size_mismatch", "unknown_medium", "cleared", "evicted_keys", "speculative_blocks",
)  # fmt: skip

log = logging.getLogger(__name__)


# ---- parameters (the reference's names and defaults; extensions are marked) ----------------


class TokenProcessorConfig(PluginParams):
    block_size: int = Field(default=16, gt=0)


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
    hash_seed: int = Field(default=STANDARD_HASH_SEED, ge=0, lt=1 << 64)
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
    hf: HFTokenizerConfig | None = None
    local: LocalTokenizerConfig | None = None
    uds: UDSTokenizerPoolConfig | None = None


class IndexerConfig(PluginParams):
    kv_block_index_config: KVBlockIndexConfig = Field(default_factory=KVBlockIndexConfig)
    tokenizers_pool_config: TokenizersPoolConfig


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

    @field_validator("tier_weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        tier_weights(value)
        return value


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
    idx = params.indexer_config
    pool = idx.tokenizers_pool_config
    tokenizer_mode(pool)
    base = "indexerConfig.tokenizersPoolConfig"
    if pool.local is not None and pool.local.tokenizer_revision:
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


def build_tokenizer(cfg: TokenizersPoolConfig) -> RequestTokenizer:
    """The pool's tokenizer: the UDS service when configured, else the model's local
    tokenizer file (tokenizer.json; tekken.json or tokenizer.model.v* in mistral mode): local
    discovery first, then the HF caches and the Hub. Raises ValueError."""
    if cfg.uds is not None:
        model = uds_model_name(cfg.model_name, cfg.uds.model_tokenizer_map)
        return UDSTokenizerClient(cfg.uds.socket_file, model, use_tcp=cfg.uds.use_tcp, timeout=1.0)
    local = cfg.local or LocalTokenizerConfig()
    hf = cfg.hf or HFTokenizerConfig()
    sources = ["path", "local"] + (["hf"] if hf.enabled else [])
    name = local.tokenizer or cfg.model_name
    mistral = tokenizer_mode(cfg) == "mistral"
    file_name = local.auto_discovery_tokenizer_file_name
    if mistral and file_name == TOKENIZER_FILE:
        file_name = TEKKEN_FILE
    hub = HFCacheSearch(
        hf.tokenizers_cache_dir or None,
        hf.tokenizer_revision or None,
        repo=hf.tokenizer or None,
        token=hf.hugging_face_token or None,
        download=not mistral,  # a Mistral repository may hold tokenizer.model.v* instead
    )
    try:
        path = (mistral_file(Path(name).expanduser()) if mistral else None) or find_tokenizer(
            name,
            local=LocalSearch(local.auto_discovery_dir, file_name, local.model_tokenizer_map),
            hf=hub,
            sources=sources,
            hub_file=TEKKEN_FILE if mistral else TOKENIZER_FILE,
        )
    except TokenizerNotFoundError as exc:
        if not (mistral and hf.enabled):
            raise ValueError(f"indexerConfig.tokenizersPoolConfig: {exc}") from exc
        try:
            path = download_mistral_tokenizer(name, hub)
        except Exception as hub_exc:
            raise ValueError(
                f"indexerConfig.tokenizersPoolConfig: {exc}; the Hugging Face Hub has none "
                f"either ({type(hub_exc).__name__}: {hub_exc})"
            ) from exc
    try:
        tokenizer = MistralRequestTokenizer(path) if mistral else LocalTokenizer(path)
    except ImportError as exc:
        raise ValueError(f"indexerConfig.tokenizersPoolConfig: {exc}") from exc
    return InProcessTokenizer(tokenizer, workers=cfg.workers_count)


def build_index(cfg: KVBlockIndexConfig, block_size: int, params: PrecisePrefixCacheParams,
                stats: KVCacheStats) -> KVBlockIndex:  # fmt: skip
    weights = params.tier_weights
    if cfg.redis_config is not None or cfg.valkey_config is not None:
        rc = cfg.redis_config or cfg.valkey_config
        assert rc is not None
        backend = "valkey" if cfg.valkey_config is not None else rc.backend_type
        return RedisIndex(
            block_size,
            rc.address,
            rc.key_prefix,
            weights,
            stats,
            backend,
            speculative=params.speculative_indexing,
        )
    if cfg.cost_aware_memory_config is not None:
        return CostAwareMemoryIndex(block_size, cfg.cost_aware_memory_config.size, weights, stats)
    mem = cfg.in_memory_config or InMemoryConfig()
    return InMemoryIndex(block_size, mem.size, mem.pod_cache_size, weights, stats)


@register(PRECISE_PREFIX_CACHE_SCORER_TYPE, PrecisePrefixCacheParams)
class PrecisePrefixCacheScorer(BasePlugin[PrecisePrefixCacheParams]):
    """Scores pods by the KV blocks they really hold, learned from their KV-cache events.

    Feed: a ZMQ subscription to every pod's vLLM KV-event publisher (kvEventsConfig). Each
    BlockStored event's token ids are cut into `tokenProcessorConfig.blockSize` blocks and keyed
    with the XXH3-64 rolling hash (heimdall_proxy.kvcache.hashing, seeded by the model, or by
    the LoRA adapter the event names); BlockRemoved and AllBlocksCleared remove them. Media
    (GPU, CPU, disk) are separate tiers. Index backends: inMemoryConfig, costAwareMemoryConfig,
    redisConfig / valkeyConfig (shared by gateway replicas). Decoding the batches and hashing
    their tokens runs in `kvEventsConfig.decodeProcesses` worker processes (kvcache.prepare),
    so the event loop that serves requests only chains the keys and updates the index.

    Request: a Producer step takes the prompt's token ids (left by the tokenizer plugin, or
    computed here with the tokenizers pool and then left on the request), keys its full
    blocks the same way (seeded by the request's adapter when it names a LoRA the pods serve,
    else by `modelName`; a `cache_salt` is keyed as vLLM keys it, see kvcache.hashing),
    looks the keys up (Redis I/O happens here, never in the scorer) and publishes a
    PrefixCacheMatchInfo on the CycleState. Score: per pod, the longest run of cached blocks
    from the start of the prompt, each block weighted by its fastest tier, over the prompt's
    block count, in [0, 1]. A request that cannot be tokenized scores 0.

    With `speculativeIndexing`, pre_request records the chosen pod (and prefill pod) as
    holding the prompt's blocks for `speculativeTTL`, covering the time until its events
    arrive. Salted blocks are recognised in events by the salt vLLM lists in the first block's
    `extra_keys`; a vLLM too old to send extra_keys makes them look unsalted.

    With `kvBlockIndexConfig.conductorConfig` (an extension) there is no local index and no
    event feed: lookups are asked of a KV cache indexer service (`heimdall-proxy conductor`
    or Mooncake Conductor) with the standard hash, the adapter and the request's cache_salt
    sent beside the keys, see kvcache.index.conductor."""

    type = PRECISE_PREFIX_CACHE_SCORER_TYPE

    def __init__(self, name: str, params: PrecisePrefixCacheParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.block_size = params.token_processor_config.block_size
        pool_cfg = params.indexer_config.tokenizers_pool_config
        self.model_name = pool_cfg.model_name
        for where in unhonoured(params):
            log.warning(
                "plugin %r (type %r): parameter %s is accepted but not honoured",
                name,
                self.type,
                where,
            )
        self.tokenizer = build_tokenizer(pool_cfg)
        self.stats = KVCacheStats()
        index_cfg = params.indexer_config.kv_block_index_config
        #: With conductorConfig the indexer service follows the events and answers lookups;
        #: no local index or event feed exists then.
        self.conductor: ConductorClient | None = None
        cc = index_cfg.conductor_config
        if cc is not None:
            self.conductor = ConductorClient(
                cc.url, self.block_size, self.model_name, cc.hash_seed, cc.tenant_id,
                cc.cache_salt, cc.timeout, params.tier_weights, self.stats,
            )  # fmt: skip
        self.index: KVBlockIndex | None = None
        self.ingest: KVEventIngest | None = None
        if cc is None:
            self.index = build_index(index_cfg, self.block_size, params, self.stats)
            ev = params.kv_events_config
            self.ingest = KVEventIngest(
                self.index,
                handle.pool,
                SubscriberOptions(
                    topic_filter=ev.topic_filter,
                    concurrency=ev.concurrency,
                    discover_pods=ev.discover_pods,
                    socket_port=ev.pod_discovery_config.socket_port,
                    zmq_endpoint=ev.zmq_endpoint,
                    replay_port_offset=ev.replay_port_offset,
                    replay_timeout=ev.replay_timeout,
                    catch_up=ev.catch_up_on_start and ev.replay_port_offset > 0,
                    catch_up_wait=ev.catch_up_wait,
                ),
                self.model_name,
                ev.decode_processes,
                name,
            )
        self.state_key = prefix_match_key(self.type, name)
        self._keys_key = f"{self.state_key}#keys"
        self._lookup_latency = HistogramFamily(
            "kvcache_index_lookup_latency_seconds",
            "Latency of KV-block index lookups (hashing the prompt included), in seconds.",
            buckets=_LOOKUP_BUCKETS,
        )
        self._observe_lookup = self._lookup_latency.labels().observe
        self._metrics_task: asyncio.Task[None] | None = None
        self._index_breaker = CircuitBreaker(f"{name}: KV index")
        self._tokenizer_breaker = CircuitBreaker(f"{name}: tokenizer")
        self._last_warning = 0.0

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self.conductor is not None:
            await self.conductor.start()
        elif self.ingest is not None:
            await self.ingest.start()
        cfg = self.params.indexer_config.kv_block_index_config
        if cfg.enable_metrics and cfg.metrics_logging_interval > 0:
            self._metrics_task = asyncio.create_task(
                self._log_metrics(cfg.metrics_logging_interval), name=f"{self.name}-metrics"
            )

    async def stop(self) -> None:
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._metrics_task
            self._metrics_task = None
        if self.conductor is not None:
            await self.conductor.close()
        elif self.ingest is not None:
            await self.ingest.stop()
        await self.tokenizer.close()

    @property
    def ready(self) -> bool:
        """Whether the index is reachable and the event feed followed (with conductorConfig:
        whether the conductor client is started)."""
        if self.conductor is not None:
            return self.conductor.ready
        return self.ingest is not None and self.ingest.ready

    async def _log_metrics(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            log.info("KV-cache index metrics", extra={"plugin": self.name, **self.stats.as_dict()})

    # ---- the request path ----------------------------------------------------------------

    def namespace(self, request: InferenceRequest, endpoints: list[Endpoint]) -> str:
        """The request's adapter name when its model is a LoRA adapter of the pods (vLLM's
        /v1/models gives adapters a `parent`), else the base model."""
        for e in endpoints:
            card = e.model_cards.get(request.model)
            if card is not None:
                return request.model if card.get("parent") else self.model_name
        return self.model_name

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        tokens = request.token_ids
        if tokens is None:
            if not self._tokenizer_breaker.allow():
                return  # the tokenizer is failing: score 0 at once instead of waiting
            try:
                tokens = await self.tokenizer.tokenize(request.api, request.data, len(request.body))
            except Exception as exc:
                self._tokenizer_breaker.failure()
                log.warning(
                    "%s: cannot tokenize the request, scoring it 0: %s",
                    self.name,
                    exc,
                    extra={"request_id": request.request_id},
                )
                return
            self._tokenizer_breaker.success()
            request.token_ids = tokens
        namespace = self.namespace(request, endpoints)
        salt = cache_salt(request)
        # Lazily hashed: the in-memory lookup stops hashing where the last pod drops out. A
        # conductor's keys are the standard ones: one seed, no salt root (the namespace and
        # the salt are sent beside them).
        if self.conductor is None:
            seed = cached_seed(namespace)
            root = None if salt is None else salt_root(salt, seed)
        else:
            seed, root = self.conductor.seed, None
        keys = LazyBlockKeys(tokens, self.block_size, seed, root=root)
        matched: dict[str, float] = {}
        if keys and self.ready and self._index_breaker.allow():
            t0 = time.perf_counter()
            try:
                pods = [e.name for e in endpoints]
                if self.conductor is not None:
                    lora = "" if namespace == self.model_name else namespace
                    matched = await self.conductor.lookup(lora, keys, pods, salt)
                elif self.index is not None:
                    matched = await self.index.lookup(keys, pods)
            except Exception as exc:  # an unreachable index: route as if nothing matched
                self._index_breaker.failure()
                self._warn(f"{self.name}: index lookup failed, scoring 0: {exc}")
            else:
                self._index_breaker.success()
            self._observe_lookup(time.perf_counter() - t0)
        state[self.state_key] = PrefixCacheMatchInfo(
            block_size=self.block_size,
            total_blocks=len(keys),
            prompt_tokens=len(tokens),
            matched_blocks=matched,
            block_keys=keys,
        )
        state[self._keys_key] = keys

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 10.0:
            self._last_warning = now
            log.warning(message)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        info = state.get(self.state_key)
        if not isinstance(info, PrefixCacheMatchInfo):
            return {e.name: 0.0 for e in endpoints}
        return {e.name: info.ratio(e.name) for e in endpoints}

    async def pre_request(self, ctx: RequestContext) -> None:
        if not self.params.speculative_indexing or self.index is None:
            return
        keys = ctx.state.get(self._keys_key)
        if not keys:
            return
        try:
            for endpoint in (ctx.target, ctx.prefill):
                if endpoint is not None:
                    await self.index.add_speculative(
                        endpoint.name, keys, self.params.speculative_ttl
                    )
        except Exception as exc:
            self._warn(f"{self.name}: speculative indexing failed: {exc}")

    def breakers(self) -> Iterable[CircuitBreaker]:
        return (self._index_breaker, self._tokenizer_breaker)

    def collect_metrics(self) -> Iterator[Metric]:
        """With `kvBlockIndexConfig.enableMetrics`: the indexer families llm-d's KV-cache
        manager exports (kvcache_index_*), and the event feed's counters."""
        if not self.params.indexer_config.kv_block_index_config.enable_metrics:
            return
        stats = self.stats
        for name, doc, value in (
            ("kvcache_index_admissions", "KV blocks admitted to the index.", stats.stored_blocks),
            ("kvcache_index_evictions", "KV blocks removed by events.", stats.removed_blocks),
            ("kvcache_index_lookup_requests", "Index lookups.", stats.lookups),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        keys = CounterMetricFamily(
            "kvcache_index_lookup_key",
            "Prompt blocks looked up, by result: hit when some candidate pod held the block "
            "and every block before it.",
            labels=["result"],
        )
        keys.add_metric(["hit"], stats.lookup_key_hits)
        keys.add_metric(["miss"], stats.lookup_keys - stats.lookup_key_hits)
        yield keys
        yield self._lookup_latency.collect()
        feed = CounterMetricFamily(
            "heimdall_kvcache_feed",
            "KV-event feed and index counters of precise-prefix-cache-scorer, by kind.",
            labels=["kind"],
        )
        for kind in _FEED_KINDS:
            feed.add_metric([kind], getattr(stats, kind))
        yield feed
