"""LocalLookup: precise-prefix-cache-scorer's lookups in an index this process feeds itself.

The PrefixLookup contract (kvcache.index.base) over a KVBlockIndex and the KVEventIngest that
follows the pods' events into it, so the scorer asks it exactly as it asks a conductor
(kvcache.index.conductor). Here a request's namespace and salt shape the keys: the chain is
seeded by the model or LoRA adapter (as the events' blocks are keyed, kvcache.prepare) and a
salted prompt starts from its salt's root (kvcache.hashing.salt_root); the lookup itself
needs only the keys."""

from __future__ import annotations

from collections.abc import Sequence

from heimdall_proxy.kvcache.hashing import LazyBlockKeys, salt_root
from heimdall_proxy.kvcache.index import KVBlockIndex, KVCacheStats
from heimdall_proxy.kvcache.ingest import KVEventIngest
from heimdall_proxy.kvcache.prepare import cached_seed


class LocalLookup:
    """Lookups in `index`, fed by `ingest` (which opens and closes the index)."""

    def __init__(self, index: KVBlockIndex, ingest: KVEventIngest) -> None:
        self.index = index
        self.ingest = ingest
        self.stats: KVCacheStats = index.stats

    @property
    def ready(self) -> bool:
        """The feed's readiness: the index answered and the pods' events are followed."""
        return self.ingest.ready

    async def start(self) -> None:
        await self.ingest.start()

    async def close(self) -> None:
        await self.ingest.stop()

    def block_keys(self, tokens: Sequence[int], namespace: str, salt: str | None) -> LazyBlockKeys:
        seed = cached_seed(namespace)
        root = None if salt is None else salt_root(salt, seed)
        return LazyBlockKeys(tokens, self.index.block_size, seed, root=root)

    async def lookup(
        self, keys: Sequence[int], pods: Sequence[str], namespace: str, salt: str | None
    ) -> dict[str, float]:
        return await self.index.lookup(keys, pods)
