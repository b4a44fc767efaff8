"""cache_salt in the precise index: read from the first block's extra_keys as vLLM sends them,
and keyed so that salted events and salted requests agree, and never match unsalted ones."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from heimdall_proxy.kvcache.events import BlockStored, decode_batch, first_block_salt
from heimdall_proxy.kvcache.hashing import LazyBlockKeys, block_keys, namespace_seed, salt_root
from heimdall_proxy.kvcache.index import InMemoryIndex, KVBlockIndex
from heimdall_proxy.kvcache.index.redis import RedisIndex
from heimdall_proxy.kvcache.prepare import apply_batch, pack, prepare_batches, unpack
from tests.kvcache.redisns import REDIS_URL
from tests.kvcache.vllm_wire import batch, stored

BS = 4
MODEL = "m"
SEED = namespace_seed(MODEL)
TOKENS = list(range(500, 500 + 4 * BS))


@pytest.mark.parametrize(
    ("extra", "lora", "salt"),
    [
        ([["tenant-a"]], None, "tenant-a"),
        ([["ad", "tenant-a"], ["ad"]], "ad", "tenant-a"),  # the adapter's name comes first
        ([["ad"]], "ad", None),
        ([["ad", "ad"]], "ad", "ad"),  # a salt equal to the adapter's name
        ([[["mm-hash", 0], "tenant-a", b"\x01" * 32]], None, "tenant-a"),  # mm, salt, embeds
        ([[["mm-hash", 0]]], None, None),
        ([None, ["x"]], None, None),  # only the first block can hold the salt
        ([[""]], None, None),
        ("garbage", None, None),
    ],
)
def test_the_salt_is_the_last_string_of_the_first_blocks_extra_keys(
    extra: Any, lora: str | None, salt: str | None
) -> None:
    assert first_block_salt(extra, lora) == salt


@pytest.mark.parametrize("shape", ["map", "array"])
def test_only_an_event_that_starts_a_prompt_carries_its_salt(shape: str) -> None:
    salted = stored([1], TOKENS[:BS], block_size=BS, extra_keys=[["s"]])
    continued = stored([2], TOKENS[BS : 2 * BS], parent=1, block_size=BS, extra_keys=[["s"]])
    events = decode_batch(batch([salted, continued, stored([3], TOKENS[:BS])], shape)).events
    assert [e.cache_salt for e in events if isinstance(e, BlockStored)] == ["s", None, None]


@pytest.fixture(params=["memory", "redis"])
async def index(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[KVBlockIndex]:
    idx: KVBlockIndex = (
        InMemoryIndex(BS) if request.param == "memory" else RedisIndex(BS, REDIS_URL, redis_prefix)
    )
    await idx.start()
    yield idx
    await idx.close()


@pytest.mark.parametrize("hashed_in_worker", [True, False])
async def test_salted_events_match_salted_requests_only(
    index: KVBlockIndex, hashed_in_worker: bool
) -> None:
    payloads = [
        # pod a: the prompt under salt "s", in two events (the second continues the first)
        batch([stored([11, 12], TOKENS[: 2 * BS], block_size=BS, extra_keys=[["s"], None])]),
        batch([stored([13, 14], TOKENS[2 * BS :], parent=12, block_size=BS)], "array"),
        # pod b: the same tokens unsalted
        batch([stored([21, 22, 23, 24], TOKENS, block_size=BS)]),
    ]
    pods = ["a", "a", "b"]
    if hashed_in_worker:  # as decodeProcesses does: hashed, packed across, unpacked
        prepared = unpack(pack(prepare_batches(payloads, BS, MODEL)))
    else:
        prepared = [decode_batch(p) for p in payloads]
    for pod, b in zip(pods, prepared, strict=True):
        assert not isinstance(b, str)
        await apply_batch(index, pod, b, MODEL)
    await index.flush()

    def request_keys(salt: str | None) -> LazyBlockKeys:
        return LazyBlockKeys(TOKENS, BS, SEED, root=None if salt is None else salt_root(salt, SEED))

    assert await index.lookup(request_keys("s"), ["a", "b"]) == {"a": 4.0}
    assert await index.lookup(request_keys(None), ["a", "b"]) == {"b": 4.0}
    assert await index.lookup(request_keys("other"), ["a", "b"]) == {}
    # unsalted keys are unchanged by the salt support
    assert list(request_keys(None)) == block_keys(TOKENS, BS, SEED)
