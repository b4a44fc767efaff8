"""What every KV-block index backend implements, the one record a BlockStored event becomes
on its way in, and what precise-prefix-cache-scorer asks of the index it scores from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from heimdall_proxy.kvcache.hashing import LazyBlockKeys
from heimdall_proxy.kvcache.index.stats import KVCacheStats


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    """One BlockStored event of `pod`, as the index needs it.

    `engine_hashes` are vLLM's hashes of the blocks (used only to find our keys again on
    removal); `parent_hash` the engine hash of the block before them (None: they start a
    prompt); `token_ids` their tokens, in engine blocks of `engine_block_size`; `seed` the
    hash seed of their namespace (model or LoRA adapter). `local_hashes` stand in for the
    token ids when kvcache.prepare hashed them already (in our block size, with `seed`).
    `root` is the virtual parent a salted prompt's chain starts from (kvcache.hashing
    salt_root), read only when `parent_hash` is None.
    An event with neither token ids nor local hashes only moves known blocks (offloading)."""

    pod: str
    medium: str | None
    engine_hashes: Sequence[int]
    parent_hash: int | None
    token_ids: Sequence[int]
    engine_block_size: int
    seed: int
    local_hashes: Sequence[int] | None = None
    root: int | None = None

    @property
    def location_only(self) -> bool:
        return not self.token_ids and self.local_hashes is None


class KVBlockIndex(Protocol):
    """An index backend. All methods are coroutines so a remote backend fits; `flush` makes
    the writes queued so far visible (a no-op in memory)."""

    block_size: int
    stats: KVCacheStats

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def block_stored(self, event: StoredBlocks) -> None:
        """Apply one BlockStored event."""
        ...

    async def block_removed(
        self, pod: str, medium: str | None, engine_hashes: Sequence[int]
    ) -> None: ...

    async def cleared(self, pod: str) -> None:
        """Forget everything `pod` holds (AllBlocksCleared, a restarted or departed pod)."""
        ...

    async def add_speculative(self, pod: str, keys: Sequence[int], ttl: float) -> None:
        """Assume `pod` holds `keys` (in its GPU tier) for `ttl` seconds."""
        ...

    async def lookup(self, keys: Sequence[int], pods: Sequence[str]) -> dict[str, float]:
        """Per pod, the tier-weighted length of its run of `keys` from the first; pods with
        none are left out."""
        ...

    async def flush(self) -> None: ...


class PrefixLookup(Protocol):
    """What precise-prefix-cache-scorer asks of the index it scores from, whoever follows the
    pods' events: this process (kvcache.lookup.LocalLookup: a KVBlockIndex and its feed) or
    a KV cache indexer service (kvcache.index.conductor.ConductorClient). The scorer picks
    one at construction and never asks which.

    A request's namespace (the model, or the LoRA adapter it names) and its cache_salt either
    shape the keys (an index that keys each namespace apart) or travel beside them in the
    lookup (a conductor, whose keys are the one standard hash); each side reads both where
    it needs them, so the scorer hands both to both calls."""

    stats: KVCacheStats

    @property
    def ready(self) -> bool:
        """Whether lookups can be trusted now (started, index reachable, feed followed)."""
        ...

    async def start(self) -> None:
        """Open the index (and follow its feed); an unreachable index is not an error here:
        `ready` stays False until it answers."""
        ...

    async def close(self) -> None:
        """Release what start opened."""
        ...

    def block_keys(self, tokens: Sequence[int], namespace: str, salt: str | None) -> LazyBlockKeys:
        """The keys of `tokens`' full blocks as this index knows them, hashed lazily."""
        ...

    async def lookup(
        self, keys: Sequence[int], pods: Sequence[str], namespace: str, salt: str | None
    ) -> dict[str, float]:
        """Per pod in `pods`, the tier-weighted length of its run of `keys` from the first
        (pods with none left out). Raises ConnectionError when the index cannot answer."""
        ...
