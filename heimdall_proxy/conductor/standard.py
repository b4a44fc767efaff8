"""Publishers that speak the standardized KV-events contract themselves (`type: Standard`).

Transport: vLLM's ZMQ framing, `(topic, seq u64 BE, payload)`, with the same replay ROUTER
protocol, so gaps between messages are replayed as for vLLM. The payload is a msgpack array
of standardized events, or a map with `events`, each a map with the seed's field names
(`event_id`, `event_type` stored | removed | cleared, the envelope, `seq_hashes`,
`base_block_idx`, `parent_hash`, `token_ids`); an envelope field left out (or null) is taken
from the registration. The seed defines the events, not a transport: this framing is our
choice, made so the subscriber, its gap replay and restart detection are shared with vLLM.

Within a message, events are ordered by `event_id` per stream (model, block size, salt,
LoRA, tenant, backend, medium, DP rank) by `StreamOrder`: an id at or below the last one
applied is a duplicate (dropped), unless it goes back to 0 or 1, where a stream that starts
over begins (its blocks are dropped first: the publisher restarted; a late duplicate of the
stream's first event is taken for a restart too); an id beyond the next is a gap,
counted (the messages carrying the missing ids were replayed already if they could be).
Events with `token_ids` carry the publisher's own hashes: the standard ones are recomputed,
as for vLLM."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from heimdall_proxy.conductor.model import (
    Cleared,
    Event,
    Registration,
    Removed,
    Stored,
    Stream,
    namespace_of,
)
from heimdall_proxy.kvcache.events import EventBatch, EventDecodeError, unpack
from heimdall_proxy.kvcache.index.tiers import tier_of

_U64 = 1 << 64


@dataclass(slots=True)
class StandardBatch(EventBatch):
    """A decoded message of a standardized publisher: its raw event maps (the envelope is
    completed from the registration when the batch is applied)."""

    raw: list[Mapping[str, Any]] = field(default_factory=list)


def decode_standard(payload: bytes) -> StandardBatch:
    """One message -> its event maps. Raises EventDecodeError."""
    doc = unpack(payload)
    if isinstance(doc, dict):
        doc = doc.get("events")
    if not isinstance(doc, list) or not all(isinstance(e, dict) for e in doc):
        raise EventDecodeError("a standardized message is an array of event maps")
    return StandardBatch(ts=0.0, events=[], raw=doc)


def _opt_str(ev: Mapping[str, Any], name: str, default: str) -> str:
    value = ev.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value


def _opt_int(ev: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = ev.get(name)
    if value is None:
        return default
    if type(value) is not int or not 0 <= value < _U64:
        raise ValueError(f"{name} must be an unsigned integer")
    return value


def _u64s(ev: Mapping[str, Any], name: str, required: bool) -> list[int] | None:
    value = ev.get(name)
    if value is None:
        if required:
            raise ValueError(f"{name} is required")
        return None
    if not isinstance(value, list) or not all(type(v) is int and 0 <= v < _U64 for v in value):
        raise ValueError(f"{name} must be an array of unsigned integers")
    return value


def to_event(reg: Registration, ev: Mapping[str, Any]) -> tuple[Event, Stream]:
    """One standardized event map of `reg`'s publisher, and the stream its event_id is
    ordered in (the event's own envelope). The event itself is placed as the registration
    says: its backend is the registered instance (the router-facing target) and its DP
    rank the registered one. Raises ValueError."""
    event_id = _opt_int(ev, "event_id", None)
    if event_id is None:
        raise ValueError("event_id is required")
    block_size = _opt_int(ev, "block_size", reg.block_size) or reg.block_size
    ns = namespace_of(
        _opt_str(ev, "model_name", reg.model),
        block_size,
        _opt_str(ev, "additional_salt", reg.additional_salt),
        _opt_str(ev, "lora_name", reg.lora_name),
        _opt_str(ev, "tenant_id", reg.tenant_id),
    )
    medium = ev.get("medium")
    if medium is not None and not isinstance(medium, str):
        raise ValueError("medium must be a string")
    tracked = tier_of(medium)
    order = Stream(
        ns,
        _opt_str(ev, "backend_id", reg.instance_id),
        tracked,
        _opt_int(ev, "dp_rank", reg.dp_rank) or 0,
    )
    stream = Stream(ns, reg.instance_id, tracked, reg.dp_rank)
    kind = ev.get("event_type")
    if kind == "stored":
        hashes = _u64s(ev, "seq_hashes", True)
        assert hashes is not None
        tokens = _u64s(ev, "token_ids", False)
        parent = _opt_int(ev, "parent_hash", None)
        base = _opt_int(ev, "base_block_idx", None)
        if parent is None and base is None:
            raise ValueError("a stored event needs base_block_idx or parent_hash")
        if tokens is not None and parent is None and base != 0:
            raise ValueError("a stored event with token_ids below the root needs parent_hash")
        return Stored(stream, event_id, hashes, base, parent, tokens, block_size), order
    if kind == "removed":
        hashes = _u64s(ev, "seq_hashes", True)
        assert hashes is not None
        return Removed(stream, event_id, hashes, _opt_int(ev, "base_block_idx", None)), order
    if kind == "cleared":
        return Cleared(stream, event_id, all_media=medium is None), order
    raise ValueError(f"unknown event_type {kind!r}")


#: What StreamOrder says of an event.
APPLY, DUPLICATE, RESTART = "apply", "duplicate", "restart"


@dataclass(slots=True)
class StreamOrder:
    """The last event_id applied per stream, and the verdict on the next one."""

    #: (publisher, stream) -> last event_id applied
    last: dict[tuple[str, Stream], int] = field(default_factory=dict)
    gaps: int = 0
    missed: int = 0
    duplicates: int = 0
    restarts: int = 0

    def admit(self, publisher: str, stream: Stream, event_id: int) -> str:
        key = (publisher, stream)
        last = self.last.get(key)
        if last is not None and event_id <= last:
            if event_id < last and event_id <= 1:
                self.last[key] = event_id
                self.restarts += 1
                return RESTART
            self.duplicates += 1
            return DUPLICATE
        if last is not None and event_id > last + 1:
            self.gaps += 1
            self.missed += event_id - last - 1
        self.last[key] = event_id
        return APPLY

    def forget(self, publisher: str) -> None:
        """Forget the streams of `publisher` (restarted, or no longer followed)."""
        self.last = {k: v for k, v in self.last.items() if k[0] != publisher}
