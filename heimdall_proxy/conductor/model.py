"""The identities and the standardized event model the conductor works in.

Every engine's events are normalised into `Stored`, `Removed` and `Cleared`, the three event
types of the standardized KV-events contract, each with the contract's envelope (`Stream`:
model, block size, additional salt, LoRA, tenant, backend, medium, DP rank). Lookups are
scoped by a `Namespace`: the stream dimensions that decide whether two blocks are
interchangeable (model, block size, salt, LoRA, tenant); backend/instance, medium and DP rank
are what a query answers with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Publisher types whose wire format this conductor reads, canonically spelt. SGLang's
#: publisher sends vLLM's msgpack batches; Standard is conductor.standard, Mooncake
#: conductor.mooncake.
VLLM, SGLANG, STANDARD, MOONCAKE = "vLLM", "SGLang", "Standard", "Mooncake"
#: lower-cased -> canonical (a registration's `type` is matched without case)
PUBLISHER_TYPES = {t.lower(): t for t in (VLLM, SGLANG, STANDARD, MOONCAKE)}
DEFAULT_TENANT = "default"


def publisher_key(instance_id: str, tenant_id: str, dp_rank: int) -> str:
    """A subscription's identity, `instance|tenant|dp_rank` (as /unregister answers)."""
    return f"{instance_id}|{tenant_id}|{dp_rank}"


def lora_identity(lora_name: str | None, lora_id: int | None) -> str | None:
    """The LoRA part of a namespace: the adapter's name, or for an adapter known only by
    vLLM's number (deprecated `lora_id`) `id:<n>`; None when neither is given."""
    if lora_name:
        return lora_name
    if lora_id is not None:
        return f"id:{lora_id}"
    return None


def _cached_hash(self: Namespace | Stream) -> int:
    """The hash of a Namespace or Stream, computed on first use and kept: every event's index
    and engine-map lookups hash the (shared, cached) object, a tuple of its fields each time
    otherwise."""
    h = self._hash
    if not h:
        h = hash(self._fields())
        object.__setattr__(self, "_hash", h)
    return h


def _rebuilt(self: Namespace | Stream) -> tuple[Any, ...]:
    """A Namespace or Stream pickled as its constructor call: rebuilt, not restored, since a
    str's hash differs between processes."""
    return type(self), self._fields()


@dataclass(frozen=True, slots=True)
class Namespace:
    """Blocks are only comparable within one namespace."""

    model: str
    block_size: int
    #: additional_salt of events / registrations, cache_salt of queries; "" for none
    salt: str
    #: the LoRA adapter's name; "" for the base model
    lora: str
    tenant: str
    _hash: int = field(init=False, repr=False, compare=False, default=0)  # _cached_hash's

    def _fields(self) -> tuple[str, int, str, str, str]:
        return self.model, self.block_size, self.salt, self.lora, self.tenant

    __hash__ = _cached_hash
    __reduce__ = _rebuilt


#: Namespaces made by namespace_of, one object per value (bounded: cache_salt namespaces are
#: per request; past the bound it starts over, and equal objects then compare by value).
_NAMESPACES: dict[tuple[str, int, str, str, str], Namespace] = {}
MAX_NAMESPACES = 4096


def namespace_of(model: str, block_size: int, salt: str, lora: str, tenant: str) -> Namespace:
    """The Namespace of these fields, the same object each time: the index's spaces and the
    engine maps are dicts keyed by namespace, and a probe with the key's own object is
    settled by identity, where an equal one runs the dataclass's `__eq__` (every event of
    every publisher of a model probes them)."""
    fields = (model, block_size, salt, lora, tenant)
    ns = _NAMESPACES.get(fields)
    if ns is None:
        if len(_NAMESPACES) >= MAX_NAMESPACES:
            _NAMESPACES.clear()
        ns = _NAMESPACES[fields] = Namespace(*fields)
    return ns


@dataclass(frozen=True, slots=True)
class Registration:
    """One KV-event publisher, as POST /register describes it (wire names in comments)."""

    endpoint: str
    replay_endpoint: str | None
    type: str  # "type", canonical spelling
    model: str  # "modelname"
    lora_name: str
    tenant_id: str
    instance_id: str
    block_size: int
    dp_rank: int
    additional_salt: str  # "additionalsalt"

    @property
    def key(self) -> str:
        """The subscription's identity (`publisher_key`)."""
        return publisher_key(self.instance_id, self.tenant_id, self.dp_rank)

    def namespace(self, lora: str | None = None, salt: str | None = None) -> Namespace:
        """The namespace of this publisher's blocks; `lora`: the adapter an event names,
        `salt`: the cache_salt a vLLM event carries (None: the registration's)."""
        return namespace_of(
            self.model,
            self.block_size,
            self.additional_salt if salt is None else salt,
            self.lora_name if lora is None else lora,
            self.tenant_id,
        )


@dataclass(frozen=True, slots=True)
class Stream:
    """The envelope of a standardized event: the dimensions its event_id is ordered in."""

    namespace: Namespace
    backend_id: str
    medium: str
    dp_rank: int
    _hash: int = field(init=False, repr=False, compare=False, default=0)  # _cached_hash's

    def _fields(self) -> tuple[Namespace, str, str, int]:
        return self.namespace, self.backend_id, self.medium, self.dp_rank

    __hash__ = _cached_hash
    __reduce__ = _rebuilt


@dataclass(slots=True)
class Stored:
    """`stored`: consecutive blocks committed. `seq_hashes` are standard sequence hashes,
    unless `token_ids` are given: then they are the engine's own hashes (kept only to apply
    later removals and to find the parent), and the standard ones are recomputed from the
    tokens."""

    stream: Stream
    event_id: int
    seq_hashes: Sequence[int]
    base_block_idx: int | None = None
    parent_hash: int | None = None
    token_ids: Sequence[int] | None = None
    #: engine blocks of this many tokens (token_ids events); the stream's block size if None
    engine_block_size: int | None = None

    @property
    def has_tokens(self) -> bool:
        """Whether the blocks' content came with the event (its token ids)."""
        return bool(self.token_ids)


@dataclass(slots=True)
class Removed:
    """`removed`: blocks evicted (engine hashes when the stream's stored events carried
    token ids, else standard sequence hashes)."""

    stream: Stream
    event_id: int
    seq_hashes: Sequence[int]
    base_block_idx: int | None = None


@dataclass(slots=True)
class Cleared:
    """`cleared`: everything of the stream purged. vLLM's AllBlocksCleared is wider: it
    purges the backend and DP rank in every namespace (`all_namespaces`), in every medium
    unless it names one (`all_media`)."""

    stream: Stream
    event_id: int
    all_namespaces: bool = False
    all_media: bool = False


Event = Stored | Removed | Cleared
