"""The KV-block index: which pods hold which blocks, in which storage tier, fed by KV events.

Lookups answer, per pod, the length of the run of blocks it holds from the start of the
prompt, each block weighted by the fastest tier holding it (GPU 1.0, CPU 0.8, disk 0.5 by
default): the longest-prefix score of the precise prefix-cache scorer.

- base: the KVBlockIndex protocol, the StoredBlocks record, and PrefixLookup (what the
  scorer asks, of a local index or of a conductor)
- keys: from a stored event to our block keys (shared by the backends)
- walk: the lookup walk over presence masks (shared by the backends)
- memory, cost_aware: in this process (bounded by keys, or by bytes)
- redis (+ lua/): in Redis or Valkey, shared by gateway replicas
- stats, tiers, sizes: counters, storage tiers and their weights, "2GiB"-style sizes
"""

from heimdall_proxy.kvcache.index.base import KVBlockIndex, PrefixLookup, StoredBlocks
from heimdall_proxy.kvcache.index.cost_aware import CostAwareMemoryIndex
from heimdall_proxy.kvcache.index.memory import InMemoryIndex
from heimdall_proxy.kvcache.index.sizes import parse_bytes
from heimdall_proxy.kvcache.index.stats import KVCacheStats
from heimdall_proxy.kvcache.index.tiers import TIERS, tier_weights

__all__ = [
    "TIERS",
    "CostAwareMemoryIndex",
    "InMemoryIndex",
    "KVBlockIndex",
    "KVCacheStats",
    "PrefixLookup",
    "StoredBlocks",
    "parse_bytes",
    "tier_weights",
]
