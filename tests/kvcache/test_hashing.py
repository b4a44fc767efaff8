"""Block keys: the XXH3-64 rolling-hash standard, checked against a direct transcription."""

from __future__ import annotations

import ctypes.util
import logging
import random
import struct
from array import array
from typing import Any

import pytest
import xxhash

from heimdall_proxy.kvcache import hashing
from heimdall_proxy.kvcache.hashing import (
    LazyBlockKeys,
    block_keys,
    namespace_seed,
    python_block_keys,
    python_text_block_keys,
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


class _Index:
    """An integer that is not an int (as numpy's are): both chains take it via __index__."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.skipif(
    ctypes.util.find_library("xxhash") is None, reason="no libxxhash here: nothing to build on"
)
def test_the_c_chain_is_built_where_libxxhash_is() -> None:
    # the extension is optional in setup.py; this keeps an install that silently fell back to
    # the Python loop from passing here
    assert hashing.NATIVE


needs_c = pytest.mark.skipif(not hashing.NATIVE, reason="the C chain is not built here")


@needs_c
@pytest.mark.parametrize("block_size", [1, 4, 16, 300])
@pytest.mark.parametrize("parent", [None, 0, 12345, 2**64 - 1])
def test_the_c_chain_gives_the_python_loops_keys(block_size: int, parent: int | None) -> None:
    rng = random.Random(block_size)
    for length in (block_size, 3 * block_size + 1, 10 * block_size):
        tokens = [rng.randrange(2**32) for _ in range(length)]
        n_all = length // block_size
        for n in {1, n_all}:
            expected = python_block_keys(tokens, block_size, 1337, parent, n)
            assert block_keys(tokens, block_size, 1337, parent, n) == expected
            assert hashing._native is not None
            assert hashing._native(array("I", tokens), block_size, 1337, parent, n) == expected
        assert block_keys(tokens, block_size, 1337, parent) == python_block_keys(
            tokens, block_size, 1337, parent, n_all
        )
    odd: list[Any] = [_Index(7), True, *range(2, 2 * block_size)]
    plain = [7, 1, *range(2, 2 * block_size)]
    assert block_keys(odd, block_size, 5) == python_block_keys(plain, block_size, 5, None, 2)


@needs_c
@pytest.mark.parametrize(
    ("bad", "error"),
    [(-1, OverflowError), (2**32, OverflowError), (2**70, OverflowError), (1.0, TypeError),
     ("7", TypeError), (None, TypeError)],
)  # fmt: skip
def test_the_c_chain_rejects_what_the_python_loop_rejects(
    bad: object, error: type[Exception]
) -> None:
    tokens: list[Any] = [*range(15), bad]
    with pytest.raises(error):
        python_block_keys(tokens, 16, 1, None, 1)
    with pytest.raises(error):
        block_keys(tokens, 16, 1)
    assert block_keys(tokens, 16, 1, max_blocks=0) == []  # only the blocks asked for are read


@needs_c
def test_the_c_chain_checks_its_arguments() -> None:
    native = hashing._native
    assert native is not None
    with pytest.raises(ValueError, match="fewer tokens"):
        native(list(range(31)), 16, 1, None, 2)
    with pytest.raises(ValueError, match="block_size"):
        native(list(range(32)), 0, 1, None, 2)
    with pytest.raises(TypeError, match="u32"):
        native(array("Q", range(32)), 16, 1, None, 2)
    # seeds are taken modulo 2**64, as the xxhash package takes them
    tokens32 = list(range(32))
    for seed in (-1, 2**64 + 5, 2**70 - 1):
        assert native(tokens32, 16, seed, None, 2) == python_block_keys(tokens32, 16, seed, None, 2)

    class Shrinks:
        """An id whose __index__ empties the list being hashed."""

        def __index__(self) -> int:
            tokens.clear()
            return 1

    tokens: list[Any] = [Shrinks(), *range(31)]
    with pytest.raises(RuntimeError, match="changed size"):
        native(tokens, 16, 1, None, 2)


@needs_c
@pytest.mark.parametrize("chars", [1, 7, 64, 300])
def test_the_c_text_chain_gives_the_python_loops_keys(chars: int) -> None:
    rng = random.Random(chars)
    for length in (chars, 5 * chars + 3):
        text = "".join(chr(rng.randrange(128)) for _ in range(length))
        n = length // chars
        expected = python_text_block_keys(text, chars, 99, n)
        assert text_block_keys(text, chars, 99) == expected
        assert text_block_keys(text, chars, 99, max_blocks=1) == expected[:1]
    # not ASCII: the Python loop (UTF-8 bytes of each chunk, lone surrogates passed through)
    mixed = "héllo wörld \ud800 " * 20
    assert text_block_keys(mixed, chars, 99) == python_text_block_keys(
        mixed, chars, 99, len(mixed) // chars
    )
    assert hashing._native_text is not None
    with pytest.raises(ValueError, match="ASCII"):
        hashing._native_text(mixed, chars, 99, None, 1)
    with pytest.raises(TypeError, match="str"):
        hashing._native_text(b"abc", 1, 99, None, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fewer characters"):
        hashing._native_text("a" * (chars - 1), chars, 99, None, 1)


def test_an_install_without_the_c_chain_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # NATIVE patched: this machine builds the extension, the warning is for one that cannot
    monkeypatch.setattr(hashing, "NATIVE", False)
    monkeypatch.setattr(hashing, "_said_python", False)
    log = logging.getLogger("test.hashing")
    with caplog.at_level(logging.WARNING, "test.hashing"):
        hashing.warn_if_python(log)
        hashing.warn_if_python(log)
    (record,) = caplog.records  # once
    assert "hashed in Python" in record.getMessage()
    assert "libxxhash >= 0.8" in record.getMessage()
