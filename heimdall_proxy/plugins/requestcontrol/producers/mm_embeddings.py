"""mm-embeddings-cache-producer (llm-d's): which pods recently encoded a request's images,
audio or video, so mm-embeddings-cache-scorer can send it where the encoder output is
likely still cached."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator

import orjson
import xxhash
from prometheus_client.core import Metric
from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.disagg import MULTIMODAL_PART_TYPES, read_plan
from heimdall_proxy.framework.encoder_cache import (
    MM_EMBEDDINGS_PRODUCER_TYPE,
    EncoderCacheMatchInfo,
    MMItem,
    match_key,
)
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    DICT_OR_MAPPING,
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.observability.loop import CounterFamily, HistogramFamily

DEFAULT_CACHE_MB = 4096
#: The encoder output one tracked item is assumed to take (llm-d's sizing).
MB_PER_ITEM = 2
#: How often entries of pods no longer in the pool are dropped (beside the
#: endpoint-notification-source's immediate drop).
SWEEP_INTERVAL = 120.0
_RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_SUBSYSTEM = "llm_d_epp_"


class MMEmbeddingsParams(PluginParams):
    #: Per-pod budget in MiB of the model server's encoder cache; <= 0: the default.
    cache_size_in_mb_per_server: int = Field(
        default=DEFAULT_CACHE_MB, alias="cacheSizeInMBPerServer"
    )

    def capacity(self) -> int:
        mb = self.cache_size_in_mb_per_server
        return max(1, (mb if mb > 0 else DEFAULT_CACHE_MB) // MB_PER_ITEM)


_MODALITY = {
    "image_url": "image",
    "input_image": "image",
    "input_audio": "audio",
    "audio_url": "audio",
    "video_url": "video",
    "input_video": "video",
}


def media_items(request: InferenceRequest) -> tuple[MMItem, ...]:
    """The distinct media items of a chat (or Responses) request, each hashed from its
    content as the client sent it (an image's URL or data URI, an audio clip's data), so the
    same image sent twice is the same item. Repeats within a request count once."""
    messages = request.data.get("messages")
    if not isinstance(messages, list):
        messages = request.data.get("input")
    if not isinstance(messages, list):
        return ()
    found: dict[str, MMItem] = {}
    for msg in messages:
        content = msg.get("content") if isinstance(msg, DICT_OR_MAPPING) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, DICT_OR_MAPPING):
                continue
            kind = part.get("type")
            if kind not in MULTIMODAL_PART_TYPES:
                continue
            value = part.get(kind)
            if value is None:  # {"type": "input_image", "image_url": "..."} (Responses)
                value = part.get("image_url") or part.get("file_id") or part.get("url")
            if value is None:
                continue
            raw = value.encode() if isinstance(value, str) else orjson.dumps(value)
            digest = xxhash.xxh3_128_hexdigest(raw)
            found[digest] = MMItem(digest, _MODALITY[str(kind)])
    return tuple(found.values())


@register(MM_EMBEDDINGS_PRODUCER_TYPE, MMEmbeddingsParams)
class MMEmbeddingsCacheProducer(BasePlugin[MMEmbeddingsParams]):
    """Keeps, per pod, an LRU of the media items recently sent there
    (`cacheSizeInMBPerServer` / 2 MiB entries: the pod's encoder cache as llm-d sizes it)
    and, for each request with images, audio or video in its chat messages, leaves on the
    CycleState which of its items each candidate pod likely holds; mm-embeddings-cache-scorer
    turns that into scores. After scheduling (pre_request) the items are recorded for the
    chosen pod, and the encode pods when the gateway ran encode hops.

    Items are the content parts' data hashed (xxh3-128 of the URL or data URI as sent):
    llm-d reads the hashes vLLM's renderer computes from a token-producer, which cannot be
    had here; the same bytes sent again give the same item all the same. A departed pod's
    entries are dropped at once when an endpoint-notification-source tells it (wire it as
    its extractor), else on a sweep every 2 minutes.

    Metrics (`llm_d_epp_` prefix, as llm-d's): `encoder_cache_queries_total` {plugin_type,
    plugin_name, modality} per item looked up, `encoder_cache_hits_total` {..., pod,
    modality} per pod holding it, `encoder_cache_hit_ratio` {plugin_type, plugin_name} of
    matched over total items per candidate pod."""

    type = MM_EMBEDDINGS_PRODUCER_TYPE

    def __init__(self, name: str, params: MMEmbeddingsParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.capacity = params.capacity()
        self.caches: dict[str, OrderedDict[str, None]] = {}
        self.state_key = match_key(name)
        self._pool = handle.pool
        self._next_sweep = time.monotonic() + SWEEP_INTERVAL
        self.queries = CounterFamily(
            _SUBSYSTEM + "encoder_cache_queries",
            "Multimodal item hash lookups against the encoder-cache affinity LRU.",
            ("plugin_type", "plugin_name", "modality"),
        )
        self.hits = CounterFamily(
            _SUBSYSTEM + "encoder_cache_hits",
            "Multimodal item hash lookups that found the item in a pod's LRU, by pod.",
            ("plugin_type", "plugin_name", "pod", "modality"),
        )
        self.hit_ratio = HistogramFamily(
            _SUBSYSTEM + "encoder_cache_hit_ratio",
            "Matched over total multimodal items of a request, per candidate pod.",
            ("plugin_type", "plugin_name"),
            buckets=_RATIO_BUCKETS,
        )

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        items = media_items(request)
        if not items:
            return
        self._sweep()
        labels = (self.type, self.name)
        for item in items:
            self.queries.labels(*labels, item.modality).inc()
            for pod, cache in self.caches.items():
                if item.hash in cache:
                    self.hits.labels(*labels, pod, item.modality).inc()
        matched: dict[str, tuple[MMItem, ...]] = {}
        observe = self.hit_ratio.labels(*labels).observe
        for endpoint in endpoints:
            known = self.caches.get(endpoint.name)
            held = tuple(i for i in items if i.hash in known) if known else ()
            if held:
                matched[endpoint.name] = held
            observe(len(held) / len(items))
        state[self.state_key] = EncoderCacheMatchInfo(items, matched)

    async def pre_request(self, ctx: RequestContext) -> None:
        info = ctx.state.get(self.state_key)
        if not isinstance(info, EncoderCacheMatchInfo):
            return
        targets = [ctx.target.name]
        plan = read_plan(ctx.state)
        if plan is not None:
            targets += [e.name for e in plan.encode]
        for pod in targets:
            cache = self.caches.setdefault(pod, OrderedDict())
            for item in info.request_items:
                cache[item.hash] = None
                cache.move_to_end(item.hash)
            while len(cache) > self.capacity:
                cache.popitem(last=False)

    def endpoint_changed(self, endpoint: Endpoint, removed: bool) -> None:
        if removed:
            self.caches.pop(endpoint.name, None)

    def _sweep(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_INTERVAL
        alive = {e.name for e in self._pool.endpoints()}
        if not alive:
            return
        for pod in [p for p in self.caches if p not in alive]:
            del self.caches[pod]

    def collect_metrics(self) -> Iterator[Metric]:
        yield self.queries.collect()
        yield self.hits.collect()
        yield self.hit_ratio.collect()
