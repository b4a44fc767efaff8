"""CostAwareMemoryIndex: the in-memory index bounded by bytes (costAwareMemoryConfig)."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.kvcache.index.memory import InMemoryIndex
from heimdall_proxy.kvcache.index.sizes import parse_bytes
from heimdall_proxy.kvcache.index.stats import KVCacheStats

#: Footprint of one stored block in InMemoryIndex (its key in a tier dict, its bitmask, its
#: engine-map entry), measured with tracemalloc: 95-135 bytes while the index grows, up to
#: ~230 once it churns at its bound (CPython dict tables are sized at 3x their live entries
#: on resize). tests/kvcache/test_index.py checks a churning index stays within its budget.
BYTES_PER_BLOCK = 256


class CostAwareMemoryIndex(InMemoryIndex):
    """InMemoryIndex bounded by memory: the byte budget is turned into a block budget with
    the measured per-block footprint (BYTES_PER_BLOCK); no per-key pod limit."""

    def __init__(
        self,
        block_size: int,
        size: str | int = "2GiB",
        weights: Mapping[str, float] | None = None,
        stats: KVCacheStats | None = None,
    ) -> None:
        self.max_bytes = parse_bytes(size)
        super().__init__(
            block_size,
            max_keys=max(64, self.max_bytes // BYTES_PER_BLOCK),
            pod_cache_size=1 << 30,
            weights=weights,
            stats=stats,
        )
