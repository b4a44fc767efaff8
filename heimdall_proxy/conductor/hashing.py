"""The standardized KV-events hash: XXH3-64 rolling sequence hashes with one fixed seed.

    local[i] = XXH3_64(tokens of block i as little-endian u32, S)
    seq[0]   = local[0]
    seq[i]   = XXH3_64(seq[i-1] as LE u64 || local[i] as LE u64, S)

S defaults to 1337, the seed Dynamo uses with the same formula, so an indexer, a gateway and
an engine that follow the standard agree on every hash. The arithmetic is kvcache.hashing's
(one implementation in the repository); what differs from the gateway's private keys is only
the seed: one constant for everything, with namespaces (model, LoRA, salt, tenant) kept apart
by the index instead of by the seed."""

from __future__ import annotations

from collections.abc import Sequence

from heimdall_proxy.kvcache.hashing import STANDARD_HASH_SEED, block_keys


def seq_hashes(
    tokens: Sequence[int],
    block_size: int,
    seed: int = STANDARD_HASH_SEED,
    parent: int | None = None,
) -> list[int]:
    """The rolling sequence hashes of the full blocks of `tokens`, chained on `parent` (the
    sequence hash of the block before them; None: from the root). Raises ValueError or
    OverflowError for a token id outside [0, 2**32)."""
    return block_keys(tokens, block_size, seed, parent)
