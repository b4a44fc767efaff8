"""The KV-cache block pool of one simulated pod, as vLLM V1's BlockPool works.

`num_gpu_blocks` blocks of `block_size` tokens. A block is in use while some request holds
it (ref count > 0). A full block gets a hash chained over its parent's hash, its token ids
and its extra keys (`extra_keys`: the LoRA adapter, and on the first block the request's
cache_salt, as vLLM's), and stays findable by that hash after its request frees it: free
blocks sit in one LRU queue, and a cached one is only forgotten when the queue hands it out
again (BlockRemoved). Requests free their blocks tail first, so the end of a prompt is
evicted before its shared beginning. With a CPU tier, a block evicted from the GPU is stored
there (BlockStored medium CPU) until the CPU tier's own LRU evicts it.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import xxhash

from heimdall_proxy.sim.kvevents import (
    CPU,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
)

ExtraKeys = tuple[str, ...] | None


def extra_keys(lora: str | None, cache_salt: str | None, index: int) -> ExtraKeys:
    """What vLLM folds into block `index`'s hash besides the tokens: the adapter's name on
    every block, then the cache_salt on the first block only (None when there is nothing)."""
    keys = ([lora] if lora else []) + ([cache_salt] if cache_salt and index == 0 else [])
    return tuple(keys) if keys else None


def block_hash(parent: int | None, token_ids: Sequence[int], extra: ExtraKeys = None) -> int:
    """64-bit hash of one full block, chained over its parent's hash."""
    h = xxhash.xxh3_64()
    h.update(b"\x00" * 9 if parent is None else b"\x01" + parent.to_bytes(8, "big"))
    h.update(array("q", token_ids).tobytes())
    for key in extra or ():
        h.update(b"\x02" + key.encode() + b"\x00")
    return h.intdigest()


class Block:
    __slots__ = ("hash", "id", "ref")

    def __init__(self, block_id: int) -> None:
        self.id = block_id
        self.ref = 0
        self.hash: int | None = None


@dataclass(slots=True, frozen=True)
class BlockMeta:
    """What a BlockStored event says about a cached block (kept to re-announce it on the
    CPU tier)."""

    parent: int | None
    token_ids: tuple[int, ...]
    lora_id: int | None
    lora_name: str | None
    extra_keys: ExtraKeys = None


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        cpu_blocks: int = 0,
        record_events: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.cpu_capacity = cpu_blocks
        self.record_events = record_events
        self.blocks = [Block(i) for i in range(num_blocks)]
        #: Free blocks, least recently freed first: allocation takes from the front.
        self._free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks)
        self._cached: dict[int, Block] = {}
        self._meta: dict[int, BlockMeta] = {}
        self._cpu: OrderedDict[int, BlockMeta] = OrderedDict()
        self.events: list[KVEvent] = []

    # ---- state ------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (free cached blocks do not count)."""
        return 1.0 - len(self._free) / self.num_blocks if self.num_blocks else 0.0

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_cpu(self) -> int:
        return len(self._cpu)

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    # ---- lookups ----------------------------------------------------------------------
    def lookup(self, hashes: Iterable[int]) -> list[Block]:
        """The cached blocks of the longest prefix of `hashes`."""
        out: list[Block] = []
        if not self.enable_caching:
            return out
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def cpu_lookup(self, hashes: Iterable[int]) -> int:
        """How many leading `hashes` the CPU tier holds; touches them."""
        n = 0
        for h in hashes:
            if h not in self._cpu:
                break
            self._cpu.move_to_end(h)
            n += 1
        return n

    # ---- allocation -------------------------------------------------------------------
    def can_allocate(self, num_new: int, computed: Sequence[Block] = ()) -> bool:
        # Cached blocks that are free now leave the free queue when taken.
        reclaimed = sum(1 for b in computed if b.ref == 0)
        return num_new <= len(self._free) - reclaimed

    def take(self, blocks: Iterable[Block]) -> None:
        """Hold blocks found in the cache."""
        for b in blocks:
            if b.ref == 0:
                del self._free[b.id]
            b.ref += 1

    def allocate(self, n: int) -> list[Block]:
        if n > len(self._free):
            raise RuntimeError("not enough free blocks")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            if block.hash is not None:
                self._evict(block)
            block.ref = 1
            out.append(block)
        return out

    def free(self, blocks: Sequence[Block]) -> None:
        """Release a request's blocks, tail first (the tail is then evicted first)."""
        for b in reversed(blocks):
            b.ref -= 1
            if b.ref == 0:
                self._free[b.id] = b

    # ---- caching ----------------------------------------------------------------------
    def cache(
        self,
        blocks: Sequence[Block],
        hashes: Sequence[int],
        parent: int | None,
        token_chunks: Sequence[Sequence[int]],
        lora_id: int | None,
        lora_name: str | None,
        extra: Sequence[ExtraKeys] | None = None,
    ) -> None:
        """Register newly full blocks under their hashes; one BlockStored per run. `extra`:
        each block's extra keys (extra_keys), published as vLLM does."""
        if not self.enable_caching:
            return
        extras = list(extra) if extra is not None else [None] * len(hashes)
        run_hashes: list[int] = []
        run_tokens: list[int] = []
        run_extra: list[ExtraKeys] = []
        run_parent = parent
        for block, h, tokens, ek in zip(blocks, hashes, token_chunks, extras, strict=True):
            if block.hash is None and h not in self._cached:
                block.hash = h
                self._cached[h] = block
                self._meta[h] = BlockMeta(parent, tuple(tokens), lora_id, lora_name, ek)
                run_hashes.append(h)
                run_tokens.extend(tokens)
                run_extra.append(ek)
            elif run_hashes:
                self._stored(run_hashes, run_parent, run_tokens, lora_id, lora_name, GPU,
                             run_extra)  # fmt: skip
                run_hashes, run_tokens, run_extra = [], [], []
            if not run_hashes:
                run_parent = h
            parent = h
        if run_hashes:
            self._stored(run_hashes, run_parent, run_tokens, lora_id, lora_name, GPU, run_extra)

    def _stored(
        self,
        hashes: list[int],
        parent: int | None,
        tokens: list[int],
        lora_id: int | None,
        lora_name: str | None,
        medium: str,
        extra: list[ExtraKeys] | None = None,
    ) -> None:
        if self.record_events:
            self.events.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=parent,
                    token_ids=tokens,
                    block_size=self.block_size,
                    lora_id=lora_id,
                    medium=medium,
                    lora_name=lora_name,
                    # vLLM omits the field when no block has extra keys
                    extra_keys=extra if extra and any(e is not None for e in extra) else None,
                )
            )

    def _removed(self, h: int, medium: str) -> None:
        if self.record_events:
            self.events.append(BlockRemoved(block_hashes=[h], medium=medium))

    def _evict(self, block: Block) -> None:
        h = block.hash
        assert h is not None
        block.hash = None
        if self._cached.get(h) is not block:
            return
        del self._cached[h]
        meta = self._meta.pop(h)
        self._removed(h, GPU)
        if self.cpu_capacity > 0:
            self._offload(h, meta)

    def _offload(self, h: int, meta: BlockMeta) -> None:
        if h in self._cpu:
            self._cpu.move_to_end(h)
            return
        if len(self._cpu) >= self.cpu_capacity:
            old, _ = self._cpu.popitem(last=False)
            self._removed(old, CPU)
        self._cpu[h] = meta
        self._stored([h], meta.parent, list(meta.token_ids), meta.lora_id, meta.lora_name, CPU,
                     [meta.extra_keys])  # fmt: skip

    def reset(self) -> bool:
        """Forget every cached block (vLLM's reset_prefix_cache): only when no block is in
        use. Emits AllBlocksCleared."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self.blocks:
            block.hash = None
        self._cached.clear()
        self._meta.clear()
        self._cpu.clear()
        if self.record_events:
            self.events.append(AllBlocksCleared())
        return True
