"""The KV-block index backends: in memory and in a real Redis, the same behaviour."""

from __future__ import annotations

import asyncio
import random
import tracemalloc
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from heimdall_proxy.kvcache.hashing import LazyBlockKeys, block_keys, namespace_seed
from heimdall_proxy.kvcache.index import (
    CostAwareMemoryIndex,
    InMemoryIndex,
    KVBlockIndex,
    StoredBlocks,
    parse_bytes,
    tier_weights,
)
from heimdall_proxy.kvcache.index.cost_aware import BYTES_PER_BLOCK
from heimdall_proxy.kvcache.index.redis import RedisIndex, names_blob, normalize_address
from tests.kvcache.redisns import REDIS_URL

BS = 16
SEED = namespace_seed("m")
PROMPT = list(range(1000, 1000 + 4 * BS))  # 4 blocks
KEYS = block_keys(PROMPT, BS, SEED)


@pytest.fixture(params=["memory", "redis"])
async def index(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[KVBlockIndex]:
    idx: KVBlockIndex
    if request.param == "memory":
        idx = InMemoryIndex(BS, pod_cache_size=64)
    else:
        idx = RedisIndex(BS, REDIS_URL, key_prefix=redis_prefix)
    await idx.start()
    yield idx
    await idx.close()


async def store(idx: KVBlockIndex, pod: str, hashes: list[int], tokens: list[int], parent: int | None = None,
                medium: str | None = "GPU", engine_bs: int = BS, seed: int = SEED) -> None:  # fmt: skip
    await idx.block_stored(StoredBlocks(pod, medium, hashes, parent, tokens, engine_bs, seed))
    await idx.flush()


async def test_runs_from_the_first_block(index: KVBlockIndex) -> None:
    await store(index, "a", [1, 2, 3, 4], PROMPT)
    await store(index, "b", [21, 22], PROMPT[: 2 * BS])
    await store(
        index, "c", [31, 32], PROMPT[2 * BS :], parent=None
    )  # blocks 3-4 as a root: other keys
    assert await index.lookup(KEYS, ["a", "b", "c", "d"]) == {"a": 4.0, "b": 2.0}
    assert await index.lookup(KEYS, ["b"]) == {"b": 2.0}
    assert await index.lookup(KEYS[:1], ["a", "b"]) == {"a": 1.0, "b": 1.0}
    assert await index.lookup([], ["a"]) == {}
    other = block_keys(PROMPT, BS, namespace_seed("adapter"))
    assert await index.lookup(other, ["a", "b"]) == {}
    assert index.stats.stored_blocks == 8 and index.stats.lookups == 5
    # key hits: the longest run any candidate held (4, 2, 1, 0, 0) of the keys looked up
    assert (index.stats.lookup_keys, index.stats.lookup_key_hits) == (4 + 4 + 1 + 0 + 4, 7)


async def test_chains_across_events_and_drops_orphans(index: KVBlockIndex) -> None:
    await store(index, "a", [1, 2], PROMPT[: 2 * BS])
    await store(index, "a", [3, 4], PROMPT[2 * BS :], parent=2)
    assert await index.lookup(KEYS, ["a"]) == {"a": 4.0}
    await store(index, "b", [9], PROMPT[2 * BS : 3 * BS], parent=12345)  # parent never seen
    assert index.stats.orphan_events == 1
    assert await index.lookup(KEYS, ["b"]) == {}


async def test_removal_and_clear(index: KVBlockIndex) -> None:
    await store(index, "a", [1, 2, 3, 4], PROMPT)
    await store(index, "b", [5, 6, 7, 8], PROMPT)
    await index.block_removed("a", "GPU", [2, 99])
    await index.flush()
    assert await index.lookup(KEYS, ["a", "b"]) == {"a": 1.0, "b": 4.0}
    assert index.stats.removed_blocks == 1 and index.stats.unknown_removals == 1
    await index.cleared("b")
    assert await index.lookup(KEYS, ["a", "b"]) == {"a": 1.0}
    # stored again after the clear: back
    await store(index, "b", [5, 6, 7, 8], PROMPT)
    assert await index.lookup(KEYS, ["a", "b"]) == {"a": 1.0, "b": 4.0}
    # a block stored again after its removal is found again (no re-hashing needed)
    await store(index, "a", [1, 2, 3, 4], PROMPT)
    assert await index.lookup(KEYS, ["a"]) == {"a": 4.0}


async def test_tiers_are_weighted(index: KVBlockIndex) -> None:
    await store(index, "a", [1, 2, 3, 4], PROMPT)
    await store(index, "b", [5, 6, 7, 8], PROMPT, medium="CPU")
    assert await index.lookup(KEYS, ["a", "b"]) == pytest.approx({"a": 4.0, "b": 3.2})
    # a's first block offloaded to CPU (a location-only event), then evicted from the GPU
    await store(index, "a", [1], [], medium="cpu")
    await index.block_removed("a", "GPU", [1])
    await index.flush()
    assert await index.lookup(KEYS, ["a"]) == pytest.approx({"a": 3.8})
    # gone from the CPU too: the run is broken at the first block
    await index.block_removed("a", "CPU", [1])
    await index.flush()
    assert await index.lookup(KEYS, ["a"]) == {}
    await store(index, "c", [9], PROMPT[:BS], medium="disk")
    assert await index.lookup(KEYS, ["c"]) == pytest.approx({"c": 0.5})
    await store(index, "c", [10], PROMPT[BS : 2 * BS], parent=9, medium="NVMe")
    assert index.stats.unknown_medium == 1


async def test_engine_blocks_larger_than_ours(index: KVBlockIndex) -> None:
    await store(index, "a", [1, 2], PROMPT, engine_bs=2 * BS)  # 2 engine blocks = 4 of ours
    assert await index.lookup(KEYS, ["a"]) == {"a": 4.0}
    await index.block_removed("a", "GPU", [2])
    await index.flush()
    assert await index.lookup(KEYS, ["a"]) == {"a": 2.0}
    await store(index, "a", [3], PROMPT[:24], engine_bs=24)
    assert index.stats.block_size_mismatch == 1


@pytest.mark.slow
async def test_speculative_entries_expire(index: KVBlockIndex) -> None:
    await index.add_speculative("s", KEYS[:3], ttl=0.3)
    assert await index.lookup(KEYS, ["s"]) == {"s": 3.0}
    await store(index, "s", [1], PROMPT[:BS])  # confirmed by an event: stays
    await asyncio.sleep(0.4)
    assert await index.lookup(KEYS, ["s"]) == {"s": 1.0}
    assert index.stats.speculative_blocks == 3


async def test_a_cold_prompt_is_hashed_one_chunk_deep() -> None:
    idx = InMemoryIndex(BS)
    await store(idx, "a", [1, 2, 3, 4], PROMPT)
    rng = random.Random(4)
    cold = LazyBlockKeys([rng.randrange(9999) for _ in range(512 * BS)], BS, SEED)
    assert await idx.lookup(cold, ["a"]) == {}
    assert cold.computed() == 64
    warm = LazyBlockKeys(PROMPT + [1] * (300 * BS), BS, SEED)
    assert await idx.lookup(warm, ["a"]) == {"a": 4.0}
    assert warm.computed() == 64


async def test_many_pods(index: KVBlockIndex) -> None:
    """64 pods holding different prefix lengths of one long prompt."""
    rng = random.Random(7)
    tokens = [rng.randrange(50_000) for _ in range(64 * BS)]
    keys = block_keys(tokens, BS, SEED)
    for p in range(64):
        await index.block_stored(StoredBlocks(f"pod-{p}", "GPU", list(range(p * 100, p * 100 + p + 1)), None,
                                 tokens[: (p + 1) * BS], BS, SEED))  # fmt: skip
    await index.flush()
    got = await index.lookup(keys, [f"pod-{p}" for p in range(64)])
    assert got == {f"pod-{p}": float(p + 1) for p in range(64)}


# ---- in memory only ----------------------------------------------------------------------


async def test_pod_cache_size_and_key_budget() -> None:
    idx = InMemoryIndex(BS, max_keys=64, pod_cache_size=2)
    for pod in ("a", "b", "c"):
        idx.stored(StoredBlocks(pod, None, [1], None, PROMPT[:BS], BS, SEED))
    assert len(idx.pods_holding(KEYS[0])) == 2
    rng = random.Random(1)
    for i in range(40):
        idx.stored(StoredBlocks("a", None, list(range(i * 10, i * 10 + 5)), None,
                   [rng.randrange(9999) for _ in range(5 * BS)], BS, SEED))  # fmt: skip
    assert len(idx) <= 64 and idx.stats.evicted_keys > 0


async def test_cost_aware_budget_holds() -> None:
    budget = 2 * 1024 * 1024
    idx = CostAwareMemoryIndex(BS, "2MiB")
    assert idx.max_keys == budget // BYTES_PER_BLOCK
    rng = random.Random(3)
    events = [
        ([rng.getrandbits(64) for _ in range(32)], [rng.randrange(50_000) for _ in range(32 * BS)])
        for _ in range(1500)
    ]  # 48k blocks, about 4x the budget
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, (hashes, tokens) in enumerate(events):
            idx.stored(StoredBlocks(f"pod-{i % 8}", None, hashes, None, tokens, BS, SEED))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(idx) <= idx.max_keys
    assert used <= budget * 1.1, used


def test_sizes_and_weights() -> None:
    assert parse_bytes("2GiB") == 2 * 1024**3
    assert parse_bytes("500MiB") == 500 * 1024**2
    assert parse_bytes("1GB") == 10**9
    assert parse_bytes("4096") == parse_bytes(4096) == 4096
    assert parse_bytes("1.5KiB") == 1536
    for bad in ("", "2XB", "-1", 0):
        with pytest.raises(ValueError, match="size"):
            parse_bytes(bad)
    assert tier_weights({"CPU": 0.5})["cpu"] == 0.5
    with pytest.raises(ValueError, match="unknown storage tier"):
        tier_weights({"tape": 0.1})
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        tier_weights({"cpu": 2.0})


# ---- Redis only --------------------------------------------------------------------------


def test_names_blob_is_prefix_and_big_endian_key_per_key() -> None:
    rng = random.Random(3)
    for prefix, n in ((b"heimdall:kv:b:", 513), (b"", 3), (b"x", 0)):
        keys = [rng.getrandbits(64) for _ in range(n)]
        expected = b"".join(prefix + k.to_bytes(8, "big") for k in keys)
        assert names_blob(prefix, keys) == expected


async def test_replicas_share_one_redis_index(redis_prefix: str) -> None:
    writer = RedisIndex(BS, REDIS_URL, key_prefix=redis_prefix)
    reader = RedisIndex(BS, "127.0.0.1:6379", key_prefix=redis_prefix)
    await writer.start()
    await reader.start()
    try:
        await store(writer, "b", [1, 2], PROMPT[: 2 * BS])
        await store(writer, "a", [1, 2, 3, 4], PROMPT)
        assert await reader.lookup(KEYS, ["a", "b"]) == {"a": 4.0, "b": 2.0}
        # the reader applies a removal it learns of through its own subscription
        await reader.block_removed("a", "GPU", [1])
        await reader.flush()
        assert await writer.lookup(KEYS, ["a", "b"]) == {"b": 2.0}
        # a stored event whose parent only the other replica cached locally
        await store(reader, "b", [3], PROMPT[2 * BS : 3 * BS], parent=2)
        assert await writer.lookup(KEYS, ["b"]) == {"b": 3.0}
    finally:
        await writer.close()
        await reader.close()


async def test_redis_scripts_are_reloaded_and_errors_are_clear(redis_prefix: str) -> None:
    idx = RedisIndex(BS, REDIS_URL, key_prefix=redis_prefix)
    await idx.start()
    try:
        client = aioredis.from_url(REDIS_URL)
        await client.script_flush()
        await client.aclose()
        await store(idx, "a", [1, 2, 3, 4], PROMPT)
        assert await idx.lookup(KEYS, ["a"]) == {"a": 4.0}
    finally:
        await idx.close()
    dead = RedisIndex(BS, "redis://127.0.0.1:1", key_prefix=redis_prefix)
    with pytest.raises(ConnectionError, match="cannot reach the redis index"):
        await dead.start()
    assert normalize_address("valkey://h:1") == "redis://h:1"
    assert normalize_address("valkeys://h:1") == "rediss://h:1"
    assert normalize_address("h:1") == "redis://h:1"


async def test_lookups_match_a_naive_model(redis_prefix: str) -> None:
    """Random pods holding random blocks (holes punched, so not always prefix-closed) in
    random tiers: both backends agree with a direct transcription of the definition."""
    rng = random.Random(11)
    n_blocks, pods = 150, [f"p{i}" for i in range(12)]
    tokens = [rng.randrange(50_000) for _ in range(n_blocks * BS)]
    keys = block_keys(tokens, BS, SEED)
    weight = {"GPU": 1.0, "CPU": 0.8, "DISK": 0.5}
    memory = InMemoryIndex(BS, pod_cache_size=64)
    remote = RedisIndex(BS, REDIS_URL, key_prefix=redis_prefix)
    await remote.start()
    present: dict[tuple[str, str], set[int]] = {}
    try:
        for p_i, pod in enumerate(pods):
            depth = rng.randrange(n_blocks + 1)
            hashes = list(range(p_i * 10_000 + 1, p_i * 10_000 + 1 + depth))
            for tier in ("GPU", "CPU", "DISK"):
                if not depth or rng.random() < 0.4:
                    continue
                for idx in (memory, remote):
                    await idx.block_stored(
                        StoredBlocks(pod, tier, hashes, None, tokens[: depth * BS], BS, SEED)
                    )
                    await idx.flush()
                have = present.setdefault((pod, tier), set(range(depth)))
                for _ in range(rng.randrange(3)):  # punch holes in this tier
                    hole = rng.randrange(depth)
                    for idx in (memory, remote):
                        await idx.block_removed(pod, tier, [hashes[hole]])
                        await idx.flush()
                    have.discard(hole)
        expected: dict[str, float] = {}
        longest = 0  # blocks from the start some pod holds (the lookup's key hits)
        for pod in pods:
            run = 0.0
            held = 0
            for b in range(n_blocks):
                best = max(
                    (w for t, w in weight.items() if b in present.get((pod, t), set())),
                    default=0.0,
                )
                if not best:
                    break
                run += best
                held += 1
            longest = max(longest, held)
            if run:
                expected[pod] = run
        assert memory.match(keys, pods) == pytest.approx(expected)
        assert await remote.lookup(keys, pods) == pytest.approx(expected)
        assert expected
        for idx in (memory, remote):
            assert (idx.stats.lookup_keys, idx.stats.lookup_key_hits) == (n_blocks, longest)
    finally:
        await remote.close()
