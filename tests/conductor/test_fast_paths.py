"""The conductor's fast paths give the plain paths' answers, on random indexes and streams.

Queries: the index's walk (chunked, early exit, prompt hashed a chunk at a time) against a
direct reading of the index's dicts, block by block, per source. The reference here is
deliberately plain: one dict probe per block and source."""

from __future__ import annotations

import random

import pytest

from heimdall_proxy.conductor.api import parse_query
from heimdall_proxy.conductor.hashing import seq_hashes
from heimdall_proxy.conductor.index import ConductorIndex
from heimdall_proxy.conductor.model import Namespace, Registration, Stored, Stream
from heimdall_proxy.conductor.service import Conductor

BLOCK = 4
NS = Namespace("m", BLOCK, "", "", "default")
pytestmark = pytest.mark.usefixtures("map_kind")  # each test on U64Map, then on DictMap


def plain_answer(
    index: ConductorIndex, ns: Namespace, keys: list[int], backends: list[str]
) -> dict[str, tuple[int, dict[str, int], dict[int, int]]]:
    """backend -> (longest, per medium, per DP rank), blocks from the start, zeros left out,
    read one block at a time."""
    space = index.spaces.get(ns)
    if space is None:
        return {}
    out: dict[str, tuple[int, dict[str, int], dict[int, int]]] = {}
    for (backend, rank), bit in space.bits.items():
        if backend not in backends:
            continue

        def held(key: int, media: list[str], bit: int = bit) -> bool:
            return any(space.media[m].get(key, 0) & bit for m in media)

        def run(media: list[str]) -> int:
            n = 0
            while n < len(keys) and held(keys[n], media):
                n += 1
            return n

        combined = run(list(space.media))
        if not combined:
            continue
        longest, media, dp = out.get(backend, (0, {}, {}))
        dp[rank] = combined
        for medium in space.media:
            n = run([medium])
            if n > media.get(medium, 0):
                media[medium] = n
        out[backend] = (max(longest, combined), media, dp)
    return out


def as_plain(hits: dict) -> dict[str, tuple[int, dict[str, int], dict[int, int]]]:  # type: ignore[type-arg]
    return {
        b: (
            h.longest,
            {m: n for m, n in h.media.items() if n},
            {r: n for r, n in h.dp.items() if n},
        )
        for b, h in hits.items()
    }


@pytest.mark.parametrize("seed", range(12))
def test_query_matches_a_block_by_block_reading(seed: int) -> None:
    rng = random.Random(seed)
    conductor = Conductor()
    backends = [f"b{i}" for i in range(rng.randint(1, 40))]
    for backend in backends:
        for rank in range(rng.randint(1, 2)):
            reg = Registration("tcp://h:1", None, "vLLM", "m", "", "default", backend, BLOCK,
                               rank, "")  # fmt: skip
            conductor.registrations[reg.key] = reg
    prompt = [rng.randrange(50_000) for _ in range(BLOCK * rng.randint(1, 300))]
    keys = seq_hashes(prompt, BLOCK)
    media = rng.choice([["gpu"], ["gpu", "cpu"], ["gpu", "cpu", "disk", "cxl"]])
    for backend in backends:
        for rank in range(2):
            for medium in media:
                if rng.random() < 0.3:
                    continue
                held = keys[: rng.randint(0, len(keys))]
                if held and rng.random() < 0.3:  # a hole in the middle
                    hole = rng.randrange(len(held))
                    held = held[:hole] + held[hole + 1 :]
                if held:
                    stream = Stream(NS, backend, medium, rank)
                    conductor.index.stored(f"{backend}|{rank}", Stored(stream, 1, held))
    asked = rng.sample(backends, rng.randint(1, len(backends)))
    expected = plain_answer(conductor.index, NS, keys, asked)
    assert as_plain(conductor.index.query(NS, keys, asked)) == expected
    # the service: tokens hashed a chunk at a time (and a cold tail never hashed)
    body = {"model": "m", "block_size": BLOCK, "token_ids": prompt}
    _, hits = conductor.query(parse_query(body, False, 1 << 20, 1 << 16, True))
    assert as_plain(hits) == plain_answer(conductor.index, NS, keys, backends)
    by_hash = {"model": "m", "block_size": BLOCK, "seq_hashes": keys}
    _, hits = conductor.query(parse_query(by_hash, True, 1 << 20, 1 << 16, True))
    assert as_plain(hits) == plain_answer(conductor.index, NS, keys, backends)


def test_cached_streams_are_the_ones_built_per_event() -> None:
    """from_vllm reuses a publisher's Stream per (LoRA, salt, medium): on a random stream of
    events, with the cache bounded low so it also starts over, every event's stream equals
    the one built for it alone."""
    from heimdall_proxy.conductor import normalise
    from heimdall_proxy.conductor.normalise import StreamCache, from_vllm
    from heimdall_proxy.kvcache.events import BlockStored, EventBatch

    rng = random.Random(5)
    reg = Registration("tcp://h:1", None, "vLLM", "m", "", "t", "a", BLOCK, 1, "salty")
    cache: StreamCache = {}
    bound = normalise.MAX_STREAMS
    normalise.MAX_STREAMS = 5
    try:
        for _ in range(300):
            ev = BlockStored(
                [rng.getrandbits(64)], None, list(range(BLOCK)), BLOCK,
                rng.choice([None, "sql", "chat"]), rng.choice([None, "GPU", "cpu", "Disk"]),
                rng.choice([None, 3]), rng.choice([None, "s1", "s2", ""]),
            )  # fmt: skip
            batch = EventBatch(0.0, [ev])
            (cached,) = from_vllm(reg, batch, streams=cache)
            (alone,) = from_vllm(reg, batch)
            assert cached.stream == alone.stream
            assert len(cache) <= 5
    finally:
        normalise.MAX_STREAMS = bound
