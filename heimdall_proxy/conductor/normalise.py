"""From an engine's KV-event batch to standardized events.

vLLM (and SGLang, which publishes vLLM's format) sends batches of BlockStored, BlockRemoved
and AllBlocksCleared (decoded by kvcache.events, both event shapes). They carry neither the
model, tenant, salt nor instance, and their hashes are the engine's own: the registration
supplies the envelope, token ids are kept so the standard hashes can be recomputed, and the
batch's publisher sequence number becomes the event_id (vLLM numbers batches, not events, per
publisher; the subscriber orders, replays and deduplicates them by that number).

A request's `cache_salt` reaches the events only in a prompt's first block (kvcache.events
reads it from `extra_keys`): that event's namespace salt is the request's salt instead of the
registration's `additionalsalt`, and the blocks chained on it follow it there (the index
finds their parent in it)."""

from __future__ import annotations

from heimdall_proxy.conductor.model import (
    Cleared,
    Event,
    Registration,
    Removed,
    Stored,
    Stream,
    lora_identity,
)
from heimdall_proxy.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from heimdall_proxy.kvcache.index.tiers import tier_of

#: A publisher's streams by (lora_name, lora_id, cache_salt, medium) of its events.
StreamKey = tuple[str | None, int | None, str | None, str | None]
StreamCache = dict[StreamKey, Stream]
#: Streams remembered per publisher at most (cache_salt is per request: without a bound a
#: publisher serving many salts would grow its cache for ever); past it, it starts over.
MAX_STREAMS = 4096


def stream_of(
    reg: Registration,
    streams: StreamCache | None,
    medium: str | None,
    lora_name: str | None = None,
    lora_id: int | None = None,
    salt: str | None = None,
) -> Stream:
    """The stream of an event of `reg`'s publisher, from `streams` when it made it before
    (removals and clears name no adapter or salt: the registration's own namespace)."""
    key = (lora_name, lora_id, salt, medium)
    stream = streams.get(key) if streams is not None else None
    if stream is None:
        ns = reg.namespace(lora_identity(lora_name, lora_id), salt)
        stream = Stream(ns, reg.instance_id, tier_of(medium), reg.dp_rank)
        if streams is not None:
            if len(streams) >= MAX_STREAMS:
                streams.clear()
            streams[key] = stream
    return stream


def from_vllm(
    reg: Registration, batch: EventBatch, event_id: int = 0, streams: StreamCache | None = None
) -> list[Event]:
    """The standardized events of one decoded vLLM batch of `reg`'s publisher. The DP rank
    is the registration's (each DP rank is registered as its own publisher). `streams`:
    the publisher's streams made so far (valid while `reg` is its registration), so its
    stored events share them rather than building a Namespace and a Stream each."""
    out: list[Event] = []
    for ev in batch.events:
        if type(ev) is BlockStored:
            out.append(
                Stored(  # positional (every vLLM event): base_block_idx, parent_hash, ...
                    stream_of(reg, streams, ev.medium, ev.lora_name, ev.lora_id, ev.cache_salt),
                    event_id,
                    ev.block_hashes,
                    None,
                    ev.parent_block_hash,
                    ev.token_ids,
                    ev.block_size or reg.block_size,
                )
            )
        elif type(ev) is BlockRemoved:
            out.append(Removed(stream_of(reg, streams, ev.medium), event_id, ev.block_hashes))
        elif type(ev) is AllBlocksCleared:
            stream = stream_of(reg, streams, ev.medium)
            out.append(Cleared(stream, event_id, True, all_media=ev.medium is None))
    return out
