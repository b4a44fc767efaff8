"""The standardized hash: vectors from a deliberately plain implementation
(tests.helpers.reference_seq_hashes), pinned as literals, so a change to the
optimised code in kvcache.hashing, to the seed or to the byte layout fails."""

from __future__ import annotations

import pytest
import xxhash

from heimdall_proxy.conductor.hashing import seq_hashes
from heimdall_proxy.kvcache.hashing import STANDARD_HASH_SEED, python_block_keys
from tests.helpers import reference_seq_hashes

#: (tokens, block_size, seed) -> hashes, produced by reference_seq_hashes.
VECTORS = [
    (list(range(1, 65)), 16, 1337,
     [16863443419780771464, 12466389667045779788, 960926348267535642, 4923844688253642376]),
    ([101, 15, 100, 55, 89, 7, 3, 2], 4, 1337, [1667876268580726115, 4609747052446350517]),
    (list(range(1000, 1256)), 128, 1337, [13369718237690293114, 12662750129344100659]),
    (list(range(1, 65)), 16, 0,
     [15195734001507359261, 18166693838618995723, 5054275587350278118, 10132242883008060935]),
]  # fmt: skip


def test_the_xxh3_primitive_matches_the_reference_vector() -> None:
    # XXH3_64bits of the empty input, seed 0, from xxHash's own documentation
    assert xxhash.xxh3_64_intdigest(b"") == 0x2D06800538D394C2


def test_the_default_seed_is_the_standards() -> None:
    assert STANDARD_HASH_SEED == 1337


@pytest.mark.parametrize(("tokens", "block_size", "seed", "expected"), VECTORS)
def test_vectors(tokens: list[int], block_size: int, seed: int, expected: list[int]) -> None:
    assert reference_seq_hashes(tokens, block_size, seed) == expected
    assert seq_hashes(tokens, block_size, seed) == expected  # the C chain, where it is built
    assert python_block_keys(tokens, block_size, seed, None, len(expected)) == expected


def test_partial_blocks_are_not_hashed_and_prefixes_agree() -> None:
    tokens = list(range(50))
    assert len(seq_hashes(tokens, 16)) == 3
    longer = seq_hashes([*tokens[:32], 999, *tokens[33:]], 16)
    assert longer[:2] == seq_hashes(tokens, 16)[:2] and longer[2] != seq_hashes(tokens, 16)[2]


def test_a_chain_continues_from_its_parent() -> None:
    tokens = list(range(7, 7 + 64))
    whole = seq_hashes(tokens, 16)
    assert seq_hashes(tokens[32:], 16, parent=whole[1]) == whole[2:]


def test_the_seed_is_honoured() -> None:
    assert seq_hashes(list(range(16)), 16, 1) != seq_hashes(list(range(16)), 16, 2)
