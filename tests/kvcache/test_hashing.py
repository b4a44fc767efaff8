"""Block keys: the XXH3-64 rolling-hash standard, checked against a direct transcription."""

from __future__ import annotations

import struct

import pytest
import xxhash

from heimdall_proxy.kvcache.hashing import (
    LazyBlockKeys,
    block_keys,
    namespace_seed,
    text_block_keys,
    tokens_to_bytes,
)
from tests.helpers import reference_seq_hashes


def test_matches_the_standard_and_ignores_a_partial_block() -> None:
    tokens = list(range(1000, 1000 + 50))
    seed = namespace_seed("m")
    assert block_keys(tokens, 16, seed) == reference_seq_hashes(tokens, 16, seed)
    assert len(block_keys(tokens, 16, seed)) == 3
    assert block_keys(tokens[:15], 16, seed) == []


def test_equal_prefixes_share_keys_until_they_differ() -> None:
    seed = namespace_seed("m")
    a = block_keys(list(range(64)), 16, seed)
    b = block_keys([*range(40), 999, *range(41, 64)], 16, seed)
    assert a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]


def test_a_chain_continues_from_its_parent() -> None:
    seed = namespace_seed("m")
    tokens = list(range(96))
    whole = block_keys(tokens, 16, seed)
    tail = block_keys(tokens[32:], 16, seed, parent=whole[1])
    assert tail == whole[2:]
    assert block_keys(tokens, 16, seed, max_blocks=2) == whole[:2]


def test_namespaces_are_separate() -> None:
    tokens = list(range(32))
    keys = {
        tuple(block_keys(tokens, 16, namespace_seed(model, salt)))
        for model, salt in (("a", None), ("b", None), ("a", "s1"), ("a", "s2"))
    }
    assert len(keys) == 4
    assert namespace_seed("a", None) == namespace_seed("a", "")


def test_tokens_are_little_endian_u32() -> None:
    assert tokens_to_bytes([1, 2**32 - 1]) == b"\x01\x00\x00\x00\xff\xff\xff\xff"


def test_text_blocks_chain_the_same_way() -> None:
    seed = namespace_seed("m")
    text = "abcdefgh" * 10
    keys = text_block_keys(text, 8, seed)
    assert len(keys) == 10
    assert len(set(keys)) == 10  # same chunk, different position: different key
    assert text_block_keys(text + "tail", 8, seed)[:10] == keys
    assert text_block_keys(text, 8, seed, max_blocks=3) == keys[:3]
    assert text_block_keys("short", 8, seed) == []
    local0 = xxhash.xxh3_64_intdigest(b"abcdefgh", seed)
    assert keys[0] == local0
    assert keys[1] == xxhash.xxh3_64_intdigest(struct.pack("<QQ", local0, local0), seed)


def test_lazy_keys_are_the_same_keys_computed_on_demand() -> None:
    seed = namespace_seed("m")
    tokens = list(range(7, 7 + 16 * 200 + 5))
    full = block_keys(tokens, 16, seed)
    lazy = LazyBlockKeys(tokens, 16, seed, chunk=64)
    assert len(lazy) == 200 and lazy.computed() == 0
    assert lazy[0:10] == full[0:10] and lazy.computed() == 64
    assert lazy[70] == full[70] and lazy.computed() == 128
    assert lazy[-1] == full[-1] and lazy.computed() == 200
    assert list(lazy) == full and lazy[5:300] == full[5:]
    with pytest.raises(IndexError):
        lazy[200]
    assert not LazyBlockKeys(tokens[:10], 16, seed)
