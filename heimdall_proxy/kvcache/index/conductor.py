"""ConductorClient: the KV-block lookups of precise-prefix-cache-scorer asked of a KV cache
indexer service over HTTP (`kvBlockIndexConfig.conductorConfig`), so several gateways share
one indexer: this repository's `heimdall-proxy conductor` or Mooncake Conductor (the same
API). The indexer follows the pods' KV events itself; the gateway only asks.

Keys are the standardized sequence hashes (one seed for everything, 1337 by default), and the
namespace travels in the query (`model`, `lora_name`, `tenant_id`, `cache_salt`), so the pods
must be registered at the indexer with `instance_id` = their endpoint name in the gateway and
`block_size` = `tokenProcessorConfig.blockSize`. A lookup is one `POST /query_by_hash`; the
answer's per-medium runs (tokens from the start of the prompt) become the scorer's
tier-weighted run: blocks within the GPU run count at the GPU's weight, those beyond it
within the CPU run at the CPU's, then disk. The answer does not say where the rest of
`longest_matched` is held (a run that leaves the GPU for the CPU mid-way shows as a CPU run
of 0): those blocks count at the CPU's weight, where vLLM offloads first. With blocks on the
GPU only, the score is exactly the in-process index's.

It is a PrefixLookup (kvcache.index.base), as the scorer's local index is: the request's
namespace and salt are not hashed into the keys but sent beside them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from heimdall_proxy.kvcache.hashing import LazyBlockKeys
from heimdall_proxy.kvcache.index.stats import KVCacheStats
from heimdall_proxy.kvcache.index.tiers import TIERS, tier_weights
from heimdall_proxy.upstream import UpstreamClient, UpstreamError, UpstreamTimeouts

_JSON = {"Content-Type": "application/json"}


class ConductorClient:
    """Lookups against a conductor at `url`."""

    def __init__(
        self,
        url: str,
        block_size: int,
        model: str,
        seed: int,
        tenant_id: str = "default",
        cache_salt: str = "",
        timeout: float = 0.5,
        weights: Mapping[str, float] | None = None,
        stats: KVCacheStats | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.block_size = block_size
        self.model = model
        self.seed = seed
        self.tenant_id = tenant_id
        self.cache_salt = cache_salt
        self.timeout = timeout
        self.stats = stats or KVCacheStats()
        w = tier_weights(weights)
        self._weights = [w[t] for t in TIERS]
        self._limits = UpstreamTimeouts(total=timeout)
        #: One lookup per scored request: the lean client (heimdall_proxy/upstream), not
        #: aiohttp's, whose cost per request is several times the lookup's.
        self._client: UpstreamClient | None = None

    async def start(self) -> None:
        if self._client is None:
            self._client = UpstreamClient(connect_timeout=None)  # each lookup's total bounds it

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def ready(self) -> bool:
        return self._client is not None

    def block_keys(self, tokens: Sequence[int], namespace: str, salt: str | None) -> LazyBlockKeys:
        """The standard keys: one seed for every namespace and no salt root (the namespace
        and the salt go in the query instead)."""
        return LazyBlockKeys(tokens, self.block_size, self.seed)

    async def lookup(
        self, keys: Sequence[int], pods: Sequence[str], namespace: str, salt: str | None = None
    ) -> dict[str, float]:
        """Per pod in `pods`, the tier-weighted run of `keys` it holds (pods with none left
        out). `namespace`: the model, or the LoRA adapter asked as `lora_name`; `salt`: the
        request's cache_salt (None: the configured `cacheSalt`). Raises ConnectionError when
        the conductor cannot be asked or answers an error."""
        if self._client is None:
            raise ConnectionError("the conductor client is not started")
        self.stats.lookups += 1
        body = {
            "model": self.model,
            "lora_name": "" if namespace == self.model else namespace,
            "seq_hashes": list(keys),
            "tenant_id": self.tenant_id,
            "block_size": self.block_size,
            "cache_salt": self.cache_salt if salt is None else salt,
        }
        try:
            status, payload = await self._client.fetch(
                "POST", self.url, "/query_by_hash", orjson.dumps(body), _JSON, self._limits
            )
            doc = orjson.loads(payload) if payload else {}
        except (UpstreamError, TimeoutError, ValueError) as exc:
            raise ConnectionError(f"conductor at {self.url}: {exc}") from exc
        if status != 200:
            raise ConnectionError(f"conductor answered {status}: {doc}")
        instances = doc.get(self.tenant_id, {}) if isinstance(doc, dict) else {}
        wanted = set(pods)
        out: dict[str, float] = {}
        longest = 0
        for pod, hit in instances.items():
            if pod in wanted and isinstance(hit, dict):
                run = self._weighted(hit)
                if run > 0:
                    out[pod] = run
                    longest = max(longest, int(hit.get("longest_matched", 0)) // self.block_size)
        self.stats.lookup_keys += len(keys)
        self.stats.lookup_key_hits += longest
        if out:
            self.stats.lookup_hits += 1
        return out

    def _weighted(self, hit: Mapping[str, Any]) -> float:
        bs = self.block_size
        total = 0.0
        covered = 0
        for tier, weight in zip(TIERS, self._weights, strict=True):
            run = int(hit.get(tier.upper(), 0)) // bs
            if run > covered:
                total += (run - covered) * weight
                covered = run
        longest = int(hit.get("longest_matched", 0)) // bs
        if longest > covered:  # held further, in media the answer cannot place
            total += (longest - covered) * self._weights[1]
        return total
