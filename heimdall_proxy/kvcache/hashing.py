"""Block keys: the XXH3-64 rolling hash of the standardised KV-events contract.

For blocks of `block_size` tokens and a seed S:

    local[i] = XXH3_64(tokens of block i as little-endian u32, S)
    seq[0]   = local[0]                                  (a chain from the root)
    seq[0]   = XXH3_64(parent_le64 || local[0]_le64, S)  (a chain continuing `parent`)
    seq[i]   = XXH3_64(seq[i-1]_le64 || local[i]_le64, S)

so equal prefixes give equal keys up to the first block that differs. Only full blocks have
keys. The seed separates namespaces whose KV blocks are not interchangeable: it is derived
from the model (the LoRA adapter's name when one is used, as vLLM keys adapter blocks apart)
and, for the approximate index, the request's cache_salt, see `namespace_seed`.

The precise index keys a cache_salt as vLLM does: vLLM adds the salt to the extra keys of a
prompt's first block only, so salted and unsalted chains differ from the first block on,
and a block that continues a known parent inherits its salt through the chain. Here a salted
chain starts from a virtual parent, `salt_root(salt, seed)`, instead of from the root; the
KV events carry the salt in the first block's extra keys (kvcache.events), so requests and
events agree.

The approximate prefix-cache-scorer uses the same chain over text chunks when a request was
not tokenized (`text_block_keys`).
"""

from __future__ import annotations

import functools
import logging
import struct
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from itertools import islice, repeat
from operator import itemgetter
from typing import overload

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest
_pack_pair = struct.Struct("<QQ").pack
_first = itemgetter(0)
_BIG_ENDIAN = sys.byteorder == "big"
_U32 = "I" if array("I").itemsize == 4 else "L"

_native: Callable[[Sequence[int], int, int, int | None, int], list[int]] | None
_native_text: Callable[[str, int, int, int | None, int], list[int]] | None
try:  # the chain in C (native/_chain.c), built where the machine can; else the loops below
    from heimdall_proxy.native._chain import ascii_block_keys as _native_text
    from heimdall_proxy.native._chain import block_keys as _native
except ImportError:  # pragma: no cover - an install without a C compiler or libxxhash
    _native = _native_text = None


#: The seed of the standardized KV-events hash (Dynamo's value), one for every namespace: a
#: KV cache indexer's keys (conductor.hashing) and the scorer's conductorConfig default.
STANDARD_HASH_SEED = 1337


def namespace_seed(model: str, salt: str | None = None) -> int:
    """The XXH3 seed S of a (model or adapter, cache_salt) namespace: XXH3_64 of
    `model` NUL `salt`, with seed 0. Every gateway replica derives the same seed, so replicas
    sharing an index agree on keys."""
    return _xxh3(f"{model}\x00{salt or ''}".encode())


def salt_root(salt: str, seed: int) -> int:
    """The virtual parent a chain salted with `salt` starts from (see the module docstring):
    seq[0] = XXH3_64(salt_root_le64 || local[0]_le64, S)."""
    return _xxh3(b"cache_salt\x00" + salt.encode("utf-8", "surrogatepass"), seed)


def _u32s(tokens: Sequence[int], n: int) -> array[int]:
    """The first `n` token ids as an array of little-endian u32 (ids must be in [0, 2**32):
    else OverflowError, or TypeError for a non-integer). A buffer, so blocks are read out of
    it without copying the whole; a list is converted by `fromlist`, the cheapest way in."""
    if type(tokens) is array and tokens.typecode == _U32:
        arr = tokens if len(tokens) == n else tokens[:n]  # checked already (parsed queries)
        if _BIG_ENDIAN:  # pragma: no cover - every supported platform is little-endian
            arr = arr[:]  # a copy: the caller's array is not byte-swapped
    elif type(tokens) is list:
        arr = array(_U32)
        arr.fromlist(tokens if len(tokens) == n else tokens[:n])
    else:
        arr = array(_U32, tokens[:n])
    if _BIG_ENDIAN:  # pragma: no cover
        arr.byteswap()
    return arr


def tokens_to_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as concatenated little-endian u32 (ids must be in [0, 2**32))."""
    return _u32s(tokens, len(tokens)).tobytes()


def local_hashes(tokens: Sequence[int], block_size: int, seed: int) -> list[int]:
    """local[i] of every full block of `tokens`: XXH3-64 of the block's little-endian u32
    token ids (in C: no Python frame per block)."""
    n = len(tokens) // block_size
    if n <= 0:
        return []
    chunks = map(_first, _chunker(block_size * 4)(_u32s(tokens, n * block_size)))
    return list(map(_xxh3, chunks, repeat(seed, n)))


def chain_keys(local: Sequence[int], seed: int, parent: int | None = None) -> list[int]:
    """The rolling keys seq[i] of blocks with local hashes `local`, chained from `parent`
    (None: from the root). One Python step per block: each key needs the one before."""
    if not local:
        return []
    h = _xxh3
    pack = _pack_pair
    if parent is None:
        prev = local[0]
        out = [prev]
        rest = local[1:]
    else:
        prev = parent
        out = []
        rest = local
    append = out.append
    for value in rest:
        prev = h(pack(prev, value), seed)
        append(prev)
    return out


def block_keys(
    tokens: Sequence[int],
    block_size: int,
    seed: int,
    parent: int | None = None,
    max_blocks: int | None = None,
) -> list[int]:
    """The rolling keys of the full blocks of `tokens` (at most `max_blocks`), chained from
    `parent` (None: from the root): `chain_keys(local_hashes(...))` in one loop, each block's
    local hash taken as the chain reaches it. The ingest and every prompt lookup pay it per
    block, so lists and u32 arrays go to the C chain when it is built (`NATIVE`)."""
    n = len(tokens) // block_size
    if max_blocks is not None and n > max_blocks:
        n = max(0, max_blocks)
    if n <= 0:
        return []
    if _native is not None and (
        type(tokens) is list or (type(tokens) is array and tokens.typecode == "I")
    ):
        return _native(tokens, block_size, seed, parent, n)
    return python_block_keys(tokens, block_size, seed, parent, n)


def python_block_keys(
    tokens: Sequence[int], block_size: int, seed: int, parent: int | None, n: int
) -> list[int]:
    """`block_keys` of the first `n` blocks (n >= 1) in Python: the reference the C chain is
    tested against, and what runs where it is not built."""
    h = _xxh3
    pack = _pack_pair
    chunks = _chunker(block_size * 4)(_u32s(tokens, n * block_size))
    out: list[int]
    if parent is None:
        ((first,),) = islice(chunks, 1)
        prev = h(first, seed)
        out = [prev]
    else:
        prev = parent
        out = []
    append = out.append
    for (chunk,) in chunks:
        prev = h(pack(prev, h(chunk, seed)), seed)
        append(prev)
    return out


class LazyBlockKeys(Sequence[int]):
    """The block keys of a prompt, computed a chunk at a time as they are read: a lookup
    that stops at the first block no pod holds (a cold prompt) hashes one chunk, not the
    whole prompt. Reading everything (len() is free) gives exactly
    `block_keys(tokens, block_size, seed, root)`; `root` is a salted chain's `salt_root`."""

    __slots__ = ("_block_size", "_chunk", "_keys", "_n", "_root", "_seed", "_tokens")

    def __init__(
        self,
        tokens: Sequence[int],
        block_size: int,
        seed: int,
        chunk: int = 64,
        root: int | None = None,
    ) -> None:
        self._root = root
        self._tokens = tokens
        self._block_size = block_size
        self._seed = seed
        self._chunk = chunk
        self._n = len(tokens) // block_size
        self._keys: list[int] = []

    def __len__(self) -> int:
        return self._n

    def _ensure(self, upto: int) -> None:
        have = len(self._keys)
        if upto <= have:
            return
        upto = min(self._n, max(upto, have + self._chunk))
        bs = self._block_size
        parent = self._keys[-1] if self._keys else self._root
        self._keys.extend(block_keys(self._tokens[have * bs : upto * bs], bs, self._seed, parent))

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, _ = index.indices(self._n)
            self._ensure(max(start, stop))
            return self._keys[index]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("block index out of range")
        self._ensure(index + 1)
        return self._keys[index]

    def __iter__(self) -> Iterator[int]:
        self._ensure(self._n)
        return iter(self._keys)

    def computed(self) -> int:
        """How many keys have been hashed so far."""
        return len(self._keys)


@functools.lru_cache(maxsize=16)
def _chunker(size: int) -> Callable[[array[int]], Iterator[tuple[bytes]]]:
    return struct.Struct(f"{size}s").iter_unpack


def text_block_keys(
    text: str, chars_per_block: int, seed: int, max_blocks: int | None = None
) -> list[int]:
    """The rolling keys of the full `chars_per_block`-character chunks of `text`: the same
    chain as `block_keys`, each local hash taken over a chunk's UTF-8 bytes (in C for an
    ASCII text, whose characters are its bytes; every untokenized request pays it)."""
    n = len(text) // chars_per_block
    if max_blocks is not None and n > max_blocks:
        n = max_blocks
    if n <= 0:
        return []
    if _native_text is not None and text.isascii():
        return _native_text(text, chars_per_block, seed, None, n)
    return python_text_block_keys(text, chars_per_block, seed, n)


def python_text_block_keys(text: str, chars_per_block: int, seed: int, n: int) -> list[int]:
    """`text_block_keys` of the first `n` chunks (n >= 1) in Python: any text, and the
    reference the C chain is tested against."""
    h = _xxh3
    pack = _pack_pair
    out: list[int] = []
    prev = -1
    for i in range(0, n * chars_per_block, chars_per_block):
        local = h(text[i : i + chars_per_block].encode("utf-8", "surrogatepass"), seed)
        prev = local if prev == -1 else h(pack(prev, local), seed)
        out.append(prev)
    return out


def _c_agrees() -> bool:
    """Whether the C chain gives the Python loops' keys on inputs that tell XXH3 releases
    apart (0-3 bytes, over 240 bytes): a libxxhash other than the one the build checked must
    not key blocks differently from engines, the conductor and other replicas. (The C chain
    reads tokens as little-endian u32 arrays, typecode "I": no other host is checked.)"""
    if _native is None or _native_text is None or _BIG_ENDIAN or _U32 != "I":
        return False
    tokens = list(range(200))
    return _native(tokens, 64, 1337, 7, 3) == python_block_keys(
        tokens, 64, 1337, 7, 3
    ) and _native_text("abc", 1, 1337, None, 3) == python_text_block_keys("abc", 1, 1337, 3)


if not _c_agrees():  # pragma: no cover - not built, or built on a library that differs
    _native = _native_text = None

#: Whether block keys are computed in C (~0.06 us per block) or in Python (~0.35 us).
NATIVE = _native is not None
_said_python = False


def warn_if_python(log: logging.Logger) -> None:
    """Say once per process, at the start of a component that hashes at volume (the
    conductor, the prefix scorers), that block keys are hashed in Python here."""
    global _said_python
    if not NATIVE and not _said_python:
        _said_python = True
        log.warning(
            "block keys are hashed in Python here (native/_chain.c was not built or "
            "disagrees with the xxhash package: it needs gcc and libxxhash >= 0.8 at install "
            "time): ~0.3 us more CPU per block"
        )
