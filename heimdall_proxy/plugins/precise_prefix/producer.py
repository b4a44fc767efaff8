"""precise-prefix-cache-producer (llm-d's): the precise KV-block index, learned from the pods'
own KV-cache events, and each request's match against it, which prefix-cache-scorer and the
other prefix readers read. precise-prefix-cache-scorer (the seeds') is the same index with
the score in the same plugin."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
    model_card,
)
from heimdall_proxy.kvcache.hashing import warn_if_python
from heimdall_proxy.kvcache.index import KVBlockIndex, KVCacheStats, PrefixLookup
from heimdall_proxy.kvcache.index.conductor import ConductorClient
from heimdall_proxy.kvcache.ingest import KVEventIngest
from heimdall_proxy.kvcache.lookup import LocalLookup
from heimdall_proxy.kvcache.subscriber import SubscriberOptions
from heimdall_proxy.observability.loop import HistogramFamily
from heimdall_proxy.plugins.precise_prefix.build import build_index, build_tokenizer
from heimdall_proxy.plugins.precise_prefix.params import (
    PrecisePrefixCacheParams,
    PrecisePrefixProducerParams,
    unhonoured,
)
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import cache_salt
from heimdall_proxy.resilience.breaker import CircuitBreaker
from heimdall_proxy.tokenization import TokenizeSkippedError

PRECISE_PREFIX_PRODUCER_TYPE = "precise-prefix-cache-producer"

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


PreciseParamsT = TypeVar("PreciseParamsT", bound=PrecisePrefixCacheParams)


class PreciseIndexOwner(BasePlugin[PreciseParamsT]):
    """The KV blocks each pod really holds, learned from its KV-cache events.

    Feed: a ZMQ subscription to every pod's vLLM KV-event publisher (kvEventsConfig). Each
    BlockStored event's token ids are cut into `tokenProcessorConfig.blockSize` blocks and keyed
    with the XXH3-64 rolling hash (heimdall_proxy.kvcache.hashing, seeded by the model, or by
    the LoRA adapter the event names); BlockRemoved and AllBlocksCleared remove them. Media
    (GPU, CPU, disk) are separate tiers. Index backends: inMemoryConfig, costAwareMemoryConfig,
    redisConfig / valkeyConfig (shared by gateway replicas). Decoding the batches and hashing
    their tokens runs in `kvEventsConfig.decodeProcesses` worker processes (kvcache.prepare),
    so the event loop that serves requests only chains the keys and updates the index.

    Request: a Producer step takes the prompt's token ids (left by a token-producer or the
    tokenizer plugin; on the scorer, else computed with its tokenizers pool and then left on
    the request; the producer without ids publishes nothing; made-up ids, from a
    token-producer's estimate backend, count as none), keys its full
    blocks the same way (seeded by the request's adapter when it names a LoRA the pods serve,
    else by `modelName`; a `cache_salt` is keyed as vLLM keys it, see kvcache.hashing),
    looks the keys up (Redis I/O happens here, never in the scorer) and publishes a
    PrefixCacheMatchInfo on the CycleState: per pod, the longest run of cached blocks from the
    start of the prompt, each block weighted by its fastest tier. A request that cannot be
    tokenized gets no match, as does one whose prompt is over
    `tokenizersPoolConfig.maxPromptChars` characters (an extension, default 1 MiB) or that
    finds the pool with 4 x that queued: those are not tokenized at all.

    With `speculativeIndexing`, pre_request records the chosen pod (and prefill pod) as
    holding the prompt's blocks for `speculativeTTL`, covering the time until its events
    arrive. Salted blocks are recognised in events by the salt vLLM lists in the first block's
    `extra_keys`; a vLLM too old to send extra_keys makes them look unsalted.

    With `kvBlockIndexConfig.conductorConfig` (an extension) there is no local index and no
    event feed: lookups are asked of a KV cache indexer service (`heimdall-proxy conductor`
    or Mooncake Conductor) with the standard hash, the adapter and the request's cache_salt
    sent beside the keys, see kvcache.index.conductor."""

    def __init__(self, name: str, params: PreciseParamsT, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        warn_if_python(log)
        self.block_size = params.token_processor_config.block_size
        pool_cfg = params.indexer_config.tokenizers_pool_config
        #: The base namespace that seeds block keys, on the request side and the event side
        #: alike: the pool's model, or, on a producer configured without one, the empty
        #: namespace (the same on both sides, so the keys still meet).
        self.model_name = pool_cfg.model_name if pool_cfg is not None else ""
        for where in unhonoured(params):
            log.warning(
                "plugin %r (type %r): parameter %s is accepted but not honoured",
                name,
                self.type,
                where,
            )
        self.tokenizer = build_tokenizer(pool_cfg) if pool_cfg is not None else None
        self.stats = KVCacheStats()
        index_cfg = params.indexer_config.kv_block_index_config
        #: The local index and its event feed; with conductorConfig neither exists (the
        #: indexer service follows the events and answers the lookups).
        self.index: KVBlockIndex | None = None
        self.ingest: KVEventIngest | None = None
        #: What produce asks, whichever of the two it is (the only choice made between them).
        self.lookups: PrefixLookup
        cc = index_cfg.conductor_config
        if cc is not None:
            self.lookups = ConductorClient(
                cc.url, self.block_size, self.model_name, cc.hash_seed, cc.tenant_id,
                cc.cache_salt, cc.timeout, params.tier_weights, self.stats,
            )  # fmt: skip
        else:
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
            self.lookups = LocalLookup(self.index, self.ingest)
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
        #: Requests not tokenized on purpose (tokenizersPoolConfig.maxPromptChars).
        self.skipped = 0

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self.lookups.start()
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
        await self.lookups.close()
        if self.tokenizer is not None:
            await self.tokenizer.close()

    def endpoint_changed(self, endpoint: Endpoint, removed: bool) -> None:
        """Wired to an endpoint-notification-source: follow a pod's KV events (or stop) as
        soon as it joins (or leaves), rather than at the feed's next reconcile tick."""
        ingest = getattr(self, "ingest", None)
        if ingest is not None and ingest.ready:
            ingest.subscriber.reconcile()

    @property
    def ready(self) -> bool:
        """Whether the index is reachable and the event feed followed (with conductorConfig:
        whether the conductor client is started)."""
        return self.lookups.ready

    async def _log_metrics(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            log.info("KV-cache index metrics", extra={"plugin": self.name, **self.stats.as_dict()})

    # ---- the request path ----------------------------------------------------------------

    def namespace(self, request: InferenceRequest, endpoints: list[Endpoint]) -> str:
        """The request's adapter name when its model is a LoRA adapter of the pods (vLLM's
        /v1/models gives adapters a `parent`), else the base model."""
        card = model_card(request.model, endpoints)
        return request.model if card is not None and card.get("parent") else self.model_name

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        # made-up ids (token-producer's estimate) never match an engine's blocks: as none
        tokens = None if request.token_ids_estimated else request.token_ids
        if tokens is None:
            if self.tokenizer is None:
                return  # no token-producer ran (or it skipped this request): no match
            if not self._tokenizer_breaker.allow():
                return  # the tokenizer is failing: score 0 at once instead of waiting
            try:
                tokens = await self.tokenizer.tokenize(request.api, request.data, len(request.body))
            except TokenizeSkippedError as exc:  # too long, or the pool is full: not a failure
                self.skipped += 1
                log.debug(
                    "%s: scoring the request 0: %s",
                    self.name,
                    exc,
                    extra={"request_id": request.request_id},
                )
                return
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
            request.token_ids_estimated = False
        namespace = self.namespace(request, endpoints)
        salt = cache_salt(request)
        # Lazily hashed: the in-memory lookup stops hashing where the last pod drops out.
        keys = self.lookups.block_keys(tokens, namespace, salt)
        matched: dict[str, float] = {}
        if keys and self.ready and self._index_breaker.allow():
            t0 = time.perf_counter()
            try:
                pods = [e.name for e in endpoints]
                matched = await self.lookups.lookup(keys, pods, namespace, salt)
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
            f"KV-event feed and index counters of {self.type}, by kind.",
            labels=["kind"],
        )
        for kind in _FEED_KINDS:
            feed.add_metric([kind], getattr(stats, kind))
        yield feed


@register(PRECISE_PREFIX_PRODUCER_TYPE, PrecisePrefixProducerParams)
class PrecisePrefixCacheProducer(PreciseIndexOwner[PrecisePrefixProducerParams]):
    """The precise index as its own plugin (llm-d's type, parameters and defaults): it needs
    a token-producer's ids, and prefix-cache-scorer names it in
    `prefixMatchInfoProducerName` to score its match."""

    type = PRECISE_PREFIX_PRODUCER_TYPE
