"""Decoding vLLM KV-event batches in every shape vLLM has used."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from heimdall_proxy.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    KVEvent,
    decode_batch,
    decode_event,
    engine_hash,
)
from heimdall_proxy.kvcache.index.tiers import tier_of
from tests.kvcache.vllm_wire import batch, cleared, removed, stored


def listed(events: list[KVEvent]) -> list[KVEvent]:
    """`events` with token ids as lists (native/_tokens.c delivers them as array('I'))."""
    for ev in events:
        if isinstance(ev, BlockStored):
            ev.token_ids = list(ev.token_ids)
    return events


@pytest.mark.parametrize("shape", ["map", "array", "map-batch"])
def test_every_shape_decodes_the_same(shape: str) -> None:
    events = [
        stored([11, 12], list(range(32)), parent=10, medium="CPU", lora_name="ad", lora_id=3),
        removed([11], medium=None),
        cleared(),
    ]
    got = decode_batch(batch(events, shape, dp_rank=2))
    assert got.dp_rank == 2 and got.ts > 0 and got.unknown == 0
    assert listed(got.events) == [
        BlockStored([11, 12], 10, list(range(32)), 16, "ad", "CPU", 3),
        BlockRemoved([11], None),
        AllBlocksCleared(),
    ]


def test_bytes_hashes_are_read_as_their_last_8_bytes() -> None:
    digest = hashlib.sha256(b"x").digest()
    assert engine_hash(digest) == int.from_bytes(digest[-8:], "big")
    assert engine_hash(b"\x01") == 1
    got = decode_batch(batch([stored([digest], list(range(16)), parent=b"\x00" * 7 + b"\x05")]))
    ev = got.events[0]
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == [engine_hash(digest)] and ev.parent_block_hash == 5
    with pytest.raises(EventDecodeError):
        engine_hash(b"")
    with pytest.raises(EventDecodeError):
        engine_hash(1.5)


def test_older_and_newer_field_lists() -> None:
    # an old publisher without medium / lora_name, a new one with extra trailing fields
    old = msgpack.packb([1.0, [["BlockStored", [1], None, [5] * 16, 16, None]]])
    ev = decode_batch(old).events[0]
    assert isinstance(ev, BlockStored) and ev.medium is None and ev.lora_name is None
    new = msgpack.packb(
        [
            1.0,
            [["BlockStored", [1], None, [5] * 16, 16, None, "GPU", None, [None], 0, "full", None]],
        ]
    )
    assert listed(decode_batch(new).events) == [BlockStored([1], None, [5] * 16, 16, None, "GPU")]
    newer_map = msgpack.packb(
        {"ts": 1.0, "events": [{**stored([1], [5] * 16), "extra_keys": [None], "group_idx": 0}]}
    )
    want = [BlockStored([1], None, [5] * 16, 16, None, "GPU")]
    assert listed(decode_batch(newer_map).events) == want
    no_rank = msgpack.packb([1.0, [["AllBlocksCleared"]]])
    assert decode_batch(no_rank).dp_rank is None


def test_unknown_events_are_counted_and_garbage_rejected() -> None:
    got = decode_batch(
        msgpack.packb([1.0, [["SomethingNew", 1], {"type": "Other"}, ["AllBlocksCleared"]]])
    )
    assert got.unknown == 2 and got.events == [AllBlocksCleared()]
    for bad in (b"\xc1", msgpack.packb(3), msgpack.packb([1.0, 5])):  # no batch at all
        with pytest.raises(EventDecodeError):
            decode_batch(bad)
    # a malformed event is counted and skipped; the batch's others apply
    got = decode_batch(
        msgpack.packb([1.0, [[1, 2], ["BlockStored", "notalist"], ["AllBlocksCleared"]]])
    )
    assert got.invalid == 2 and got.events == [AllBlocksCleared()]


def test_sglangs_salt_metadata_and_strict_names() -> None:
    # SGLang's BlockStoredWithMetadata: {"cache_salt"} where vLLM has lora_name
    salted = ["BlockStored", [1], None, [5] * 16, 16, None, "CPU_PINNED", {"cache_salt": "t-a"}]
    ev = decode_batch(msgpack.packb([1.0, [salted], 0])).events[0]
    assert isinstance(ev, BlockStored)
    assert ev.cache_salt == "t-a" and ev.lora_name is None and ev.medium == "CPU_PINNED"
    chained = [*salted[:2], 7, *salted[3:]]  # a block after the first inherits its chain's salt
    ev = decode_batch(msgpack.packb([1.0, [chained]])).events[0]
    assert isinstance(ev, BlockStored) and ev.cache_salt is None and ev.lora_name is None
    # the map form names it "metadata"
    as_map = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
              "token_ids": [5] * 16, "block_size": 16, "lora_name": "ad",
              "metadata": {"cache_salt": "t-b"}}  # fmt: skip
    ev = decode_batch(msgpack.packb([1.0, [as_map]])).events[0]
    assert isinstance(ev, BlockStored) and ev.cache_salt == "t-b" and ev.lora_name == "ad"
    # a name that is no string makes its event malformed (not a namespace named after its
    # repr): it is counted and skipped, the batch's other events apply
    for field, value in ((6, 3), (7, [1]), (7, {"cache_salt": 5})):
        bad = list(salted)
        bad[field] = value
        got = decode_batch(msgpack.packb([1.0, [bad, salted, ["BlockRemoved", [1], 2]]]))
        assert got.invalid == 2 and len(got.events) == 1
        with pytest.raises(EventDecodeError, match="must be a string"):
            decode_event(bad)


def test_engine_media_names_map_to_tiers() -> None:
    assert [tier_of(m) for m in (None, "", "GPU", "CPU", "cpu_pinned", "CPU_PINNED", "DISK")] == [
        "gpu", "gpu", "gpu", "cpu", "cpu", "cpu", "disk"
    ]  # fmt: skip
    assert tier_of("EXTERNAL") == "external"  # no tier: kept under its own name
