"""native/_vllm_ingest.c: vLLM batches applied in C leave the index, the engine-hash maps
and every counter exactly as the Python path does.

Two conductors get the same random batches from several publishers: one through the loop's
prepare step (plain batches applied in C, as far as C goes), the other decoded and applied
in Python. The batches mix what C applies (decode-step and prefill stores, removals) with
everything it must leave to Python (orphans, blocks stored again, salts, LoRA, another
engine block size, another medium, several media in a batch, signed hashes, wide token ids,
clears), at small and large index bounds (evictions)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import msgpack
import pytest

from heimdall_proxy.conductor import native_ingest
from heimdall_proxy.conductor.model import Registration
from heimdall_proxy.conductor.service import Conductor, ServiceOptions
from heimdall_proxy.kvcache.events import decode_batch

BLOCK = 4

if not native_ingest.enabled():  # pragma: no cover - pip install -e . builds it
    pytest.fail("native/_vllm_ingest.c is not built", pytrace=False)


def registrations(conductor: Conductor, n: int) -> list[Registration]:
    regs = []
    for i in range(n):
        reg = Registration("tcp://h:1", None, "vLLM", "m", "", "default", f"p{i}", BLOCK, 0, "")
        conductor.registrations[reg.key] = reg  # fed directly, not subscribed
        regs.append(reg)
    return regs


class Publisher:
    """One engine's random but coherent event stream: chains continued, blocks evicted.
    `kind` 0 sends what C applies or must stop at (orphans, blocks stored again, a second
    medium); 1 also salted and LoRA chains (maps in several namespaces: removals are then
    Python's); 2 also what turns its maps into DictMaps (signed hashes, two-key engine
    blocks) and clears."""

    def __init__(self, rng: random.Random, kind: int) -> None:
        self.rng = rng
        self.kind = kind
        self.tips: list[int] = []  # last engine hash of each open chain
        self.held: list[int] = []  # engine hashes stored
        self.next = rng.randrange(1 << 40)

    def _hashes(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(50_000) for _ in range(n)]

    def event(self) -> list[Any]:
        rng = self.rng
        r = rng.random()
        medium = "GPU" if rng.random() < 0.9 else "CPU"
        if r < 0.45 and self.tips:  # a decode step: one block on an open chain
            i = rng.randrange(len(self.tips))
            (h,) = self._hashes(1)
            ev = ["BlockStored", [h], self.tips[i], self._tokens(BLOCK), BLOCK, None, medium,
                  None, None]  # fmt: skip
            self.tips[i] = h
            self.held.append(h)
            return ev
        if r < 0.65:  # a prefill: a new chain, sometimes salted or on an adapter
            n = rng.randint(1, 6)
            hashes = self._hashes(n)
            extra: Any = rng.choice([None, [None] * n])
            lora = None
            if self.kind and rng.random() < 0.2:
                extra, lora = rng.choice([([["salt-a"]] + [None] * (n - 1), None), (None, "ad")])
            ev = ["BlockStored", hashes, None, self._tokens(n * BLOCK), BLOCK, None, medium,
                  lora, extra]  # fmt: skip
            self.tips.append(hashes[-1])
            self.held += hashes
            return ev
        if r < 0.8 and self.held:  # evictions, some unknown
            k = min(len(self.held), rng.randint(1, 4))
            gone = rng.sample(self.held, k) + (
                [rng.randrange(1 << 50)] if rng.random() < 0.2 else []
            )
            return ["BlockRemoved", gone, medium]
        if r < 0.85:  # an orphan: a parent never seen
            (h,) = self._hashes(1)
            return ["BlockStored", [h], rng.randrange(1 << 62), self._tokens(BLOCK), BLOCK,
                    None, medium, None, None]  # fmt: skip
        if r < 0.9 and self.held:  # a block stored again (offloaded back, say)
            h = rng.choice(self.held)
            return ["BlockStored", [h], None, self._tokens(BLOCK), BLOCK, None, medium,
                    None, None]  # fmt: skip
        if r < 0.93 and self.kind == 2:  # another engine block size, a wide id, a signed hash
            n = 2
            hashes = self._hashes(n)
            kind = rng.randrange(3)
            if kind == 0:
                return ["BlockStored", hashes[:1], None, self._tokens(2 * BLOCK), 2 * BLOCK,
                        None, medium, None, None]  # fmt: skip
            if kind == 1:
                return ["BlockStored", hashes, None, [1 << 33] * (n * BLOCK), BLOCK, None,
                        medium, None, None]  # fmt: skip
            return ["BlockStored", [-hashes[0]], None, self._tokens(BLOCK), BLOCK, None,
                    medium, None, None]  # fmt: skip
        if r < 0.94 and self.kind == 2:
            return ["AllBlocksCleared"]
        (h,) = self._hashes(1)  # a newer vLLM's extra fields
        return ["BlockStored", [h], None, self._tokens(BLOCK), BLOCK, None, medium, None,
                None, 0, "full"]  # fmt: skip

    def batch(self, per: int) -> bytes:
        events = [self.event() for _ in range(per)]
        return msgpack.packb([self.rng.random() * 1e9, events, 0])


def state(conductor: Conductor) -> dict[str, Any]:
    index = conductor.index
    return {
        "spaces": {
            ns: (dict(s.bits), {m: list(d.items()) for m, d in s.media.items()})
            for ns, s in index.spaces.items()
        },
        "engine": {
            pub: {ns: list(m.items()) for ns, m in maps.items()}
            for pub, maps in index.engines.maps.items()
        },
        "stats": dataclasses.asdict(conductor.stats),
        "events": dataclasses.asdict(conductor.events),
    }


@pytest.mark.parametrize(("seed", "max_keys"), [(1, 50_000_000), (2, 50_000_000), (3, 300)])
def test_both_paths_leave_the_same_index_maps_and_counters(seed: int, max_keys: int) -> None:
    rng = random.Random(seed)
    options = ServiceOptions(max_blocks_per_medium=max_keys)
    native, python = Conductor(options), Conductor(options)
    regs = registrations(native, 3)
    registrations(python, 3)
    publishers = {reg.key: Publisher(random.Random(rng.random()), i) for i, reg in enumerate(regs)}
    applied = 0
    real_apply = native_ingest.apply

    def counting(*args: Any) -> Any:
        nonlocal applied
        done = real_apply(*args)
        applied += done[0] if done else 0
        return done

    async def feed() -> None:
        for _ in range(600):
            key = rng.choice(list(publishers))
            payload = publishers[key].batch(rng.choice([1, 1, 2, 8]))
            await native.apply(key, native_ingest.prepare(payload))  # type: ignore[arg-type]
            await python.apply(key, decode_batch(payload))

    native_ingest.apply = counting  # type: ignore[assignment]
    try:
        asyncio.run(feed())
    finally:
        native_ingest.apply = real_apply  # type: ignore[assignment]
    assert state(native) == state(python)
    assert applied > 300  # many events went the C way: the comparison means something
    assert native.events.stored > 500 and native.stats.removed_blocks > 50
    if max_keys < 1000:
        assert native.stats.evicted_keys > 0


def test_what_is_not_plain_is_decoded_as_before() -> None:
    ok = ["BlockStored", [1], None, [1, 2, 3, 4], BLOCK, None, "GPU", None, None]
    plain = msgpack.packb([1.5, [ok, ["BlockRemoved", [1], "GPU"]], 2])
    got = native_ingest.prepare(plain)
    assert type(got) is native_ingest.PlainBatch
    assert (got.ts, got.dp_rank, got.medium, got.count) == (1.5, 2, "GPU", 2)
    for events in (
        [ok, ["AllBlocksCleared"]],  # another event type
        [ok, [*ok[:6], "CPU", *ok[7:]]],  # two media
        [[*ok[:7], "adapter", None]],  # a LoRA
        [[*ok[:8], [["a-salt"]]]],  # a salt on a chain's first block
        [{"type": "BlockStored", "block_hashes": [1]}],  # the map form
        [["BlockStored", [b"\x01" * 32], None, [1, 2, 3, 4], BLOCK]],  # a hash as bytes
        [[*ok[:4]]],  # no block size
    ):
        payload = msgpack.packb([1.5, events, 0])
        got = native_ingest.prepare(payload)
        assert type(got) is not native_ingest.PlainBatch and got == decode_batch(payload)
    newer = msgpack.packb([1.5, [[*ok, 0, "full"]], 0])  # fields newer than the reader
    assert type(native_ingest.prepare(newer)) is native_ingest.PlainBatch
    # a str that is no UTF-8 anywhere: msgpack refuses the batch, so scan must too
    bad = msgpack.packb([1.5, [[*ok, "x"]], 0]).replace(b"\xa1x", b"\xa1\xff")
    assert type(native_ingest.prepare(bad)) is str
    # bytes after the batch, a cut: the decoder's error, not a plain batch
    assert type(native_ingest.prepare(plain + b"\x00")) is str
    assert type(native_ingest.prepare(plain[:-3])) is str


def test_any_block_size_the_api_takes() -> None:
    """A registration's block size past 2**20 (the API asks only for >= 1): its batches
    apply as in Python, natively where they can."""
    big = (1 << 20) + 1
    native, python = Conductor(), Conductor()
    for c in (native, python):
        c.registrations["p|default|0"] = Registration(
            "tcp://h:1", None, "vLLM", "m", "", "default", "p", big, 0, ""
        )
    batches = [
        msgpack.packb([1.0, [["BlockStored", [7], None, [3] * big, big, None, "GPU"]], 0]),
        msgpack.packb([2.0, [["BlockStored", [8], 7, [4] * big, big, None, "GPU"]], 0]),
        msgpack.packb([3.0, [["BlockRemoved", [7, 9], "GPU"]], 0]),
    ]

    async def feed() -> None:
        for payload in batches:
            await native.apply("p|default|0", native_ingest.prepare(payload))  # type: ignore[arg-type]
            await python.apply("p|default|0", decode_batch(payload))

    asyncio.run(feed())
    assert state(native) == state(python)
    assert native.stats.stored_blocks == 2 and native.stats.removed_blocks == 1
