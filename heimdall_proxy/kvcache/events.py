"""Decoding vLLM's KV-cache event batches.

A ZMQ message from a vLLM publisher is three frames: topic, sequence number (8 bytes
big-endian) and a msgpack payload, the batch. vLLM has sent the batch in two shapes, and its
events in two shapes, all accepted here:

- batch: `[ts, [events...], data_parallel_rank]` (msgspec array_like, older vLLM; the rank is
  optional) or `{"ts", "events", "data_parallel_rank"}` (newer vLLM);
- event: a positional array tagged by class name first,
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys, ...]`, `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`
  (fields newer than the reader may follow, and older publishers stop earlier), or a map
  tagged by `"type"` with the same field names.

`extra_keys` (newer vLLM, one entry per block: None or the tuple vLLM folded into that
block's hash: LoRA name, multimodal identifiers, cache_salt, prompt-embedding digests, in that
order) is read for one thing: the cache_salt of a chain's first block. vLLM adds the salt to
the block at token 0 only, so it is the last string of the first block's extra keys when the
event starts a prompt (no parent), after the adapter's name. (A vLLM that gives multimodal
identifiers as bare strings makes an unsalted multimodal first block read as salted: its keys
then match no text request, which vLLM would not reuse either.)

SGLang's publisher sends the same frames and shapes (an older one without `medium` and
with `[ts, events]` batches); a salted SGLang block is a BlockStored whose field after
`medium` (where vLLM has `lora_name`) is a map, `{"cache_salt": ...}` (`"metadata"` in the
map form): that is read as the chain's salt. Its CPU tier is named `CPU_PINNED`
(kvcache.index.tiers maps it). A malformed event (a name that is no string, a hash that is
no integer) is counted in its batch's `invalid` and skipped; the batch's others apply.

Block hashes are integers or bytes (vLLM's sha256 hashes); bytes are read as the big-endian
integer of their last 8 bytes, as vLLM itself converts them, so every engine hash is an int.

Token ids are read without an int object each where native/_tokens.c is built: it rewrites
the ids of BlockStored events (either form) as u32 bytes before msgpack decodes the batch,
and they arrive here as array('I') (kvcache.hashing reads that as it is); elsewhere, a list.
"""

from __future__ import annotations

import logging
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

_pack_token_ids: Callable[[bytes], bytes | None] | None
try:  # native/_tokens.c, built where the machine can
    from heimdall_proxy.native._tokens import pack_token_ids as _pack_token_ids
except ImportError:  # pragma: no cover - an install without a C compiler
    _pack_token_ids = None
if sys.byteorder != "little" or array("I").itemsize != 4:  # pragma: no cover
    _pack_token_ids = None  # it packs little-endian u32s
#: Whether token ids are read as u32 arrays (native/_tokens.c built) or as lists of ints.
PACKS_TOKENS = _pack_token_ids is not None

log = logging.getLogger(__name__)

#: Positional field order of the array-tagged form (after the tag).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
)
_REMOVED_FIELDS = ("block_hashes", "medium")
_INT = {int}
_SEQUENCES = (list, tuple)


class EventDecodeError(ValueError):
    """A payload that is not a vLLM KV-event batch."""


@dataclass(slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    #: a list, or array('I') when native/_tokens.c packed them (see the module docstring)
    token_ids: Sequence[int]
    block_size: int
    lora_name: str | None
    medium: str | None
    lora_id: int | None = None
    #: The cache_salt of the prompt the blocks start (read from extra_keys; None when the
    #: event continues a parent, whose key carries the salt already).
    cache_salt: str | None = None
    #: The local hashes of the tokens in the index's block size, when kvcache.prepare
    #: computed them (the token ids are dropped then).
    local_hashes: list[int] | None = None


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None


@dataclass(slots=True)
class AllBlocksCleared:
    medium: str | None = None


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class EventBatch:
    ts: float
    events: list[KVEvent]
    dp_rank: int | None = None
    #: Events of a type this reader does not know (skipped).
    unknown: int = 0
    #: Events dropped as malformed (e.g. a token id outside 0..2**64-1); the rest apply.
    invalid: int = 0


def engine_hash(value: Any) -> int:
    """An engine block hash as an int (bytes: the big-endian value of the last 8 bytes)."""
    if type(value) is int:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if not raw:
            raise EventDecodeError("empty block hash")
        return int.from_bytes(raw[-8:], "big")
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise EventDecodeError(f"a block hash must be an int or bytes, not {type(value).__name__}")


def _hashes(value: Any) -> list[int]:
    if type(value) is not list:
        if not isinstance(value, tuple):
            raise EventDecodeError("block_hashes must be a list")
        value = list(value)
    ints: list[int] = value
    if set(map(type, ints)) <= _INT:  # the usual case, checked in C
        return ints
    return [engine_hash(h) for h in value]


def _values(raw: Any, names: Sequence[str]) -> Sequence[Any]:
    """The values of `names` in one event (a dict, or a tagged list whose fields follow the
    tag), None where a field is missing, read in place."""
    if type(raw) is dict:
        return list(map(raw.get, names))
    values: Sequence[Any] = raw[1 : len(names) + 1]
    if len(values) < len(names):  # an older publisher stops earlier
        values = [*values, *([None] * (len(names) - len(values)))]
    return values


def _str_or_none(value: Any, field: str) -> str | None:
    if value is None or type(value) is str:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise EventDecodeError(f"{field} must be a string, not {type(value).__name__}")


def _metadata_salt(metadata: dict[Any, Any]) -> str | None:
    """The cache_salt of SGLang's BlockStored metadata map, or None."""
    salt = _str_or_none(metadata.get("cache_salt"), "metadata.cache_salt")
    return salt or None


def first_block_salt(extra_keys: Any, lora_name: str | None) -> str | None:
    """The cache_salt vLLM folded into a prompt's first block, from the event's extra_keys
    (see the module docstring), or None."""
    if not isinstance(extra_keys, _SEQUENCES) or not extra_keys:
        return None
    first = extra_keys[0]
    if not isinstance(first, _SEQUENCES):
        return None
    keys = list(first)
    if lora_name is not None and keys and keys[0] == lora_name:
        keys = keys[1:]  # vLLM puts the adapter's name first
    for key in reversed(keys):
        if type(key) is str:
            return key or None
        if isinstance(key, bytes | bytearray):
            continue  # a prompt-embedding digest follows the salt
        return None  # a multimodal (identifier, offset) pair comes last: no salt
    return None


def decode_event(raw: Any, packed: bool = False) -> KVEvent | None:
    """One event, or None for an event type this reader does not know. msgpack gives maps as
    dicts and arrays as lists, so those are what is checked (a tuple is taken as an array).
    `packed`: the batch went through _tokens.c, whose token ids are bytes of u32."""
    if type(raw) is dict:
        tag = raw.get("type")
    elif isinstance(raw, _SEQUENCES) and raw:
        tag = raw[0]
    else:
        tag = None
    if tag == "BlockStored":
        hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra = _values(
            raw, _STORED_FIELDS
        )
        hashes = _hashes(hashes)
        if type(tokens) is not list:
            if type(tokens) is bytes and packed and not len(tokens) % 4:
                ids = array("I")
                ids.frombytes(tokens)
                tokens = ids
            elif tokens is None:
                tokens = []
            elif isinstance(tokens, tuple):
                tokens = list(tokens)
            else:
                raise EventDecodeError("token_ids must be a list")
        if type(block_size) is not int or block_size < 0:
            block_size = len(tokens) // len(hashes) if hashes else 0
        metadata = None
        if type(lora_name) is dict:  # SGLang's metadata, where vLLM has lora_name
            metadata, lora_name = lora_name, None
        elif type(raw) is dict and type(raw.get("metadata")) is dict:  # the same, as a map
            metadata = raw["metadata"]
        lora_name = _str_or_none(lora_name, "lora_name")
        return BlockStored(  # positional: a third of the keyword call's cost, per event
            hashes,  # block_hashes
            None if parent is None else engine_hash(parent),  # parent_block_hash
            tokens,  # token_ids
            block_size,
            lora_name,
            _str_or_none(medium, "medium"),
            lora_id if type(lora_id) is int else None,
            None  # cache_salt: a chain's first block carries it, the rest inherit it
            if parent is not None
            else first_block_salt(extra, lora_name)
            if metadata is None
            else _metadata_salt(metadata),
        )
    if tag == "BlockRemoved":
        hashes, medium = _values(raw, _REMOVED_FIELDS)
        return BlockRemoved(_hashes(hashes), _str_or_none(medium, "medium"))
    if tag == "AllBlocksCleared":
        medium = raw.get("medium") if type(raw) is dict else None
        return AllBlocksCleared(_str_or_none(medium, "medium"))
    if not isinstance(tag, str):
        raise EventDecodeError("an event must be a tagged array or a map with 'type'")
    return None


def unpack(payload: bytes) -> Any:
    """A message's msgpack payload as Python values (maps with any keys). Raises
    EventDecodeError."""
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        # TypeError: a map whose key is a list or map (unhashable), which msgpack allows
        raise EventDecodeError(f"not msgpack: {exc}") from exc


def decode_batch(payload: bytes) -> EventBatch:
    """A msgpack payload -> EventBatch. Raises EventDecodeError."""
    packed = (
        _pack_token_ids(payload) if _pack_token_ids is not None and type(payload) is bytes else None
    )
    raw = unpack(payload if packed is None else packed)
    if type(raw) is dict:
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif type(raw) is list and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise EventDecodeError("a batch must be [ts, events, dp_rank] or a map")
    if not isinstance(events, _SEQUENCES):
        raise EventDecodeError("a batch's events must be a list")
    out: list[KVEvent] = []
    unknown = invalid = 0
    for item in events:
        try:
            event = decode_event(item, packed is not None)
        except EventDecodeError as exc:
            invalid += 1  # one malformed event: the batch's others still count
            log.debug("skipped a malformed KV event: %s", exc)
            continue
        if event is None:
            unknown += 1
        else:
            out.append(event)
    return EventBatch(  # positional: ts, events, dp_rank, unknown, invalid
        float(ts) if type(ts) is float or isinstance(ts, int | float) else 0.0,
        out,
        rank if type(rank) is int else None,
        unknown,
        invalid,
    )


def decode_payload(
    payload: bytes, decode: Callable[[bytes], EventBatch] = decode_batch
) -> EventBatch | str:
    """`decode` (vLLM's decode_batch unless another wire format's decoder is given), with an
    undecodable payload returned as its error message."""
    try:
        return decode(payload)
    except EventDecodeError as exc:
        return str(exc)


def decode_payloads(payloads: Iterable[bytes]) -> Iterator[EventBatch | str]:
    """decode_payload for each payload, lazily: a batch is decoded when it is read, so a
    consumer that applies each before reading the next keeps one batch's token lists alive
    at a time (decoding a burst up front costs ~30% more, in cache misses)."""
    return map(decode_payload, payloads)
