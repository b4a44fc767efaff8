"""Mooncake Store's KV-event publisher (`type: Mooncake`), as its subscriber guide documents
it (Mooncake docs/source/design/kv-event/mooncake_event_subscriber_guide.md).

Wire: vLLM's ZMQ framing (topic, default "mooncake"; 8-byte big-endian sequence; msgpack
payload) and replay protocol; the payload is `[ts, [events]]`, each event a tagged array:

- `["BlockStoreEvent", mooncake_key, replicas, model_name, block_size, block_hash,
  parent_block_hash, token_ids]`: a block put into the store, `replicas` its locations as
  `[type, location]` pairs (`memory`, `disk`, `local_disk`); empty strings mean unset;
- `["BlockUpdateEvent", mooncake_key, replicas]`: the key's replicas after a copy, removal
  or migration (no replica left: the block is gone);
- `["RemoveAllEvent"]`.

Normalised: a replica's type is its medium (`memory` is the host pool G2, `cpu`; `disk` and
`local_disk` the disk pool G3, `disk`; other types keep their name); a block is `stored` in
each medium it has a replica in, keyed by the standard hash recomputed from its token ids
(Mooncake's hashes are strings of its own: they are mapped, as vLLM's are); an update
stores or removes it per medium; RemoveAllEvent clears the publisher. The store is a cache
daemon: its blocks are answered under the registered `instance_id` and DP rank.

Replay: the guide's request is vLLM's; its end marker is described as eight 0xFF bytes, read
here as vLLM's sequence -1. Were it sent as a payload instead, a replay still ends once the
missing sequence numbers have arrived (or at the replay timeout)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from heimdall_proxy.conductor.model import (
    Cleared,
    Event,
    Namespace,
    Registration,
    Removed,
    Stored,
    Stream,
    namespace_of,
)
from heimdall_proxy.kvcache.events import EventBatch, EventDecodeError, unpack
from heimdall_proxy.kvcache.index.tiers import tier_of

#: Mooncake replica types -> tracked media
REPLICA_MEDIA = {"memory": "cpu", "disk": "disk", "local_disk": "disk"}


@dataclass(slots=True)
class MooncakeBatch(EventBatch):
    """A decoded Mooncake message: its raw events (normalised when applied)."""

    raw: list[list[Any]] = field(default_factory=list)


def decode_mooncake(payload: bytes) -> MooncakeBatch:
    """One message -> its events. Raises EventDecodeError."""
    doc = unpack(payload)
    if not isinstance(doc, list) or len(doc) < 2 or not isinstance(doc[1], list):
        raise EventDecodeError("a Mooncake batch is [ts, [events]]")
    ts = doc[0] if isinstance(doc[0], int | float) and not isinstance(doc[0], bool) else 0.0
    events = [e for e in doc[1] if isinstance(e, list) and e and isinstance(e[0], str)]
    return MooncakeBatch(ts=float(ts), events=[], unknown=len(doc[1]) - len(events), raw=events)


def text_hash(value: Any) -> int | None:
    """Mooncake's string hash (or key) as an int: a hex string's value, else the XXH3-64 of
    its UTF-8 bytes; None for an empty or missing one."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value & ((1 << 64) - 1)
    if not isinstance(value, str) or not value:
        return None
    try:
        return int(value, 16) & ((1 << 64) - 1)
    except ValueError:
        return xxhash.xxh3_64_intdigest(value.encode("utf-8", "surrogatepass"))


def replica_media(replicas: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(replicas, list):
        for replica in replicas:
            if isinstance(replica, list) and replica and isinstance(replica[0], str):
                out.add(REPLICA_MEDIA.get(replica[0], tier_of(replica[0])))
    return out


@dataclass(slots=True)
class MooncakeState:
    """Per publisher: each Mooncake key's block (engine hash) and the media it is in, so an
    update, which names only the key, can be applied."""

    keys: dict[int, tuple[Namespace, int, frozenset[str]]] = field(default_factory=dict)


def from_mooncake(
    reg: Registration, raw_events: Iterable[list[Any]], state: MooncakeState
) -> tuple[list[Event], int]:
    """The standardized events of one Mooncake message, and how many events were malformed
    (skipped). `state` is the publisher's, updated."""
    out: list[Event] = []
    invalid = 0
    for raw in raw_events:
        tag = raw[0]
        if tag == "BlockStoreEvent":
            fields = raw[1:8]
            if len(fields) < 7:
                invalid += 1
                continue
            key, replicas, model, _, block_hash, parent, tokens = fields
            key_hash = text_hash(key)
            own = text_hash(block_hash)
            tokens_ok = isinstance(tokens, list) and all(
                type(t) is int and 0 <= t < 1 << 32 for t in tokens
            )
            if key_hash is None or not tokens_ok:
                invalid += 1
                continue
            engine = own if own is not None else key_hash
            ns = reg.namespace()
            if isinstance(model, str) and model:
                ns = namespace_of(model, ns.block_size, ns.salt, ns.lora, ns.tenant)
            media = frozenset(replica_media(replicas))
            state.keys[key_hash] = (ns, engine, media)
            for medium in sorted(media):
                stream = Stream(ns, reg.instance_id, medium, reg.dp_rank)
                out.append(Stored(stream, 0, [engine], parent_hash=text_hash(parent),
                                  token_ids=tokens, engine_block_size=len(tokens)))  # fmt: skip
        elif tag == "BlockUpdateEvent":
            key_hash = text_hash(raw[1]) if len(raw) > 2 else None
            if key_hash is None:
                invalid += 1
                continue
            known = state.keys.get(key_hash)
            if known is None:
                continue  # a key stored before this conductor followed the publisher
            ns, engine, before = known
            after = frozenset(replica_media(raw[2]))
            for medium in sorted(before - after):
                out.append(Removed(Stream(ns, reg.instance_id, medium, reg.dp_rank), 0, [engine]))
            for medium in sorted(after - before):  # a copy: the block's keys are known
                stream = Stream(ns, reg.instance_id, medium, reg.dp_rank)
                out.append(Stored(stream, 0, [engine], token_ids=[]))
            if after:
                state.keys[key_hash] = (ns, engine, after)
            else:
                del state.keys[key_hash]
        elif tag == "RemoveAllEvent":
            state.keys.clear()
            stream = Stream(reg.namespace(), reg.instance_id, "cpu", reg.dp_rank)
            out.append(Cleared(stream, 0, all_namespaces=True, all_media=True))
    return out, invalid
