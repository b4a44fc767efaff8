"""Block keys: the XXH3-64 rolling hash of the standardised KV-events contract.

For blocks of `block_size` tokens and a seed S:

    local[i] = XXH3_64(tokens of block i as little-endian u32, S)
    seq[0]   = local[0]                                  (a chain from the root)
    seq[0]   = XXH3_64(parent_le64 || local[0]_le64, S)  (a chain continuing `parent`)
    seq[i]   = XXH3_64(seq[i-1]_le64 || local[i]_le64, S)

so equal prefixes give equal keys up to the first block that differs. Only full blocks have
keys. The seed separates namespaces whose KV blocks are not interchangeable: it is derived
from the model (the LoRA adapter's name when one is used, as vLLM keys adapter blocks apart)
and the request's cache_salt, see `namespace_seed`.

The approximate prefix-cache-scorer uses the same chain over text chunks when a request was
not tokenized (`text_block_keys`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest
_pack_pair = struct.Struct("<QQ").pack
_BIG_ENDIAN = sys.byteorder == "big"
_U32 = "I" if array("I").itemsize == 4 else "L"


def namespace_seed(model: str, salt: str | None = None) -> int:
    """The XXH3 seed S of a (model or adapter, cache_salt) namespace: XXH3_64 of
    `model` NUL `salt`, with seed 0. Every gateway replica derives the same seed, so replicas
    sharing an index agree on keys."""
    return _xxh3(f"{model}\x00{salt or ''}".encode())


def tokens_to_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as concatenated little-endian u32 (ids must be in [0, 2**32))."""
    arr = array(_U32, tokens)
    if _BIG_ENDIAN:  # pragma: no cover - every supported platform is little-endian
        arr.byteswap()
    return arr.tobytes()


def block_keys(
    tokens: Sequence[int],
    block_size: int,
    seed: int,
    parent: int | None = None,
    max_blocks: int | None = None,
) -> list[int]:
    """The rolling keys of the full blocks of `tokens` (at most `max_blocks`), chained from
    `parent` (None: from the root)."""
    n = len(tokens) // block_size
    if max_blocks is not None and n > max_blocks:
        n = max_blocks
    if n <= 0:
        return []
    step = block_size * 4
    buf = tokens_to_bytes(tokens[: n * block_size] if len(tokens) != n * block_size else tokens)
    return _chain(buf, step, n * step, seed, parent)


def _chain(buf: bytes, step: int, end: int, seed: int, parent: int | None) -> list[int]:
    # One loop, locals only: this runs for every block of every KV event and every prompt.
    h = _xxh3
    pack = _pack_pair
    out: list[int] = []
    append = out.append
    if parent is None:
        prev = h(buf[0:step], seed)
        append(prev)
        start = step
    else:
        prev = parent
        start = 0
    for off in range(start, end, step):
        prev = h(pack(prev, h(buf[off : off + step], seed)), seed)
        append(prev)
    return out


def text_block_keys(
    text: str, chars_per_block: int, seed: int, max_blocks: int | None = None
) -> list[int]:
    """The rolling keys of the full `chars_per_block`-character chunks of `text`: the same
    chain as `block_keys`, each local hash taken over a chunk's UTF-8 bytes."""
    n = len(text) // chars_per_block
    if max_blocks is not None and n > max_blocks:
        n = max_blocks
    if n <= 0:
        return []
    h = _xxh3
    pack = _pack_pair
    out: list[int] = []
    prev = -1
    for i in range(0, n * chars_per_block, chars_per_block):
        local = h(text[i : i + chars_per_block].encode("utf-8", "surrogatepass"), seed)
        prev = local if prev == -1 else h(pack(prev, local), seed)
        out.append(prev)
    return out
