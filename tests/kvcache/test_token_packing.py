"""native/_tokens.c: a batch decoded with its token ids packed as u32 gives what the plain
msgpack decode gives, event for event, on every shape and on garbage.

The reference is the decoder with the packing turned off (as where the extension is not
built); token ids are compared as lists."""

from __future__ import annotations

import contextlib
import random
import struct
from array import array
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heimdall_proxy.kvcache import events
from heimdall_proxy.kvcache.events import BlockStored, EventBatch, EventDecodeError, decode_batch
from tests.kvcache.vllm_wire import batch, cleared, removed, stored

if not events.PACKS_TOKENS:  # pragma: no cover - pip install -e . builds it
    pytest.fail("native/_tokens.c is not built", pytrace=False)

from heimdall_proxy.native._tokens import pack_token_ids


def plain(payload: bytes) -> EventBatch | str:
    packer = events._pack_token_ids
    events._pack_token_ids = None
    try:
        return outcome(payload)
    finally:
        events._pack_token_ids = packer


def outcome(payload: bytes) -> EventBatch | str:
    """The batch with token ids as lists, or the decoder's error."""
    try:
        got = decode_batch(payload)
    except EventDecodeError as exc:
        return f"error: {exc}"
    for ev in got.events:
        if isinstance(ev, BlockStored):
            ev.token_ids = list(ev.token_ids)
    return got


def same(payload: bytes) -> None:
    assert outcome(payload) == plain(payload)


def test_prefill_events_arrive_as_u32_arrays() -> None:
    ids = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1]
    for shape in ("array", "map", "map-batch"):
        payload = batch([stored([1, 2], ids, parent=9), removed([1]), cleared()], shape)
        got = decode_batch(payload)
        ev = got.events[0]
        assert isinstance(ev, BlockStored) and type(ev.token_ids) is array
        assert list(ev.token_ids) == ids
        same(payload)


def test_what_is_not_rewritten() -> None:
    # ids out of u32 (negative, too wide) stay a list: the decoder's checks see them
    for ids in ([1, -1, 2], [1, 2**32], [1, 2**63]):
        payload = batch([stored([1], ids)], "array")
        assert pack_token_ids(payload) is None
        same(payload)
    # token ids sent as a bin are refused as before: nothing in the payload is rewritten
    bad = msgpack.packb([0.0, [["BlockStored", [1], None, b"\x00" * 8, 2], ["BlockStored",
                        [2], None, [1, 2], 2]]])  # fmt: skip
    assert pack_token_ids(bad) is None
    got = decode_batch(bad)
    assert got.invalid == 1 and [list(e.token_ids) for e in got.events] == [[1, 2]]  # type: ignore[union-attr]
    # not msgpack, or cut short anywhere: the same error as without the rewrite
    good = batch([stored([1, 2], list(range(600)), parent=3), removed([1])], "array")
    for cut in range(0, len(good), 7):
        same(good[:cut])
    for junk in (b"", b"\xc1", b"\x92\xcb", b"\xdd\xff\xff\xff\xff", b"\x91\xc0"):
        same(junk)


# msgpack values as a publisher may send them around the token ids
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=5),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
ids = st.lists(st.integers(0, 2**32 - 1), max_size=40) | st.lists(
    st.integers(-(2**63), 2**64 - 1), max_size=5
)


@st.composite
def vllm_event(draw: Any) -> Any:
    tag = draw(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "X"]))
    hashes = draw(st.lists(st.integers(0, 2**64 - 1), max_size=4))
    tail = draw(st.lists(values, max_size=5))
    tokens = draw(ids | st.binary(max_size=8))  # a bin: the payload is left alone
    if draw(st.booleans()):
        return {"type": tag, "block_hashes": hashes, "token_ids": tokens, "x": tail}
    if tag == "BlockStored":
        return [tag, hashes, draw(st.none() | st.integers(0, 9)), tokens, *tail]
    return [tag, hashes, *tail]


@settings(max_examples=300, deadline=None)
@given(
    evs=st.lists(vllm_event(), max_size=4),
    shape=st.sampled_from(["array", "map", "short"]),
    cut=st.integers(0, 3),
)
@pytest.mark.slow
def test_random_batches_decode_alike(evs: list[Any], shape: str, cut: int) -> None:
    if shape == "array":
        payload = msgpack.packb([1.5, evs, 0])
    elif shape == "map":
        payload = msgpack.packb({"ts": 1.5, "x": [1, "events"], "events": evs})
    else:
        payload = msgpack.packb([1.5, evs])
    same(payload)
    same(payload[: len(payload) - cut])


# ---- every msgpack encoding of a value, not only the shortest packb picks -----------------


def encode(value: Any, rng: random.Random) -> bytes:
    """`value` as msgpack, each int, str, bin, array and map header in a width chosen at
    random among those that hold it (msgpack allows any)."""

    def header(n: int, fix: int | None, fixmax: int, wide: list[tuple[int, str]]) -> bytes:
        options = [bytes([fix | n])] if fix is not None and n <= fixmax else []
        options += [
            bytes([b]) + struct.pack(f, n) for b, f in wide if n < 1 << (8 * struct.calcsize(f))
        ]
        return rng.choice(options)

    if value is None or isinstance(value, bool):
        return {None: b"\xc0", False: b"\xc2", True: b"\xc3"}[value]
    if isinstance(value, int):
        options = []
        if 0 <= value <= 0x7F or -32 <= value < 0:
            options.append(struct.pack(">b" if value < 0 else ">B", value))
        for code, fmt in ((0xCC, ">B"), (0xCD, ">H"), (0xCE, ">I"), (0xCF, ">Q"),
                          (0xD0, ">b"), (0xD1, ">h"), (0xD2, ">i"), (0xD3, ">q")):  # fmt: skip
            with contextlib.suppress(struct.error):  # too wide for it
                options.append(bytes([code]) + struct.pack(fmt, value))
        return rng.choice(options)
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode()
        return header(len(raw), 0xA0, 31, [(0xD9, ">B"), (0xDA, ">H"), (0xDB, ">I")]) + raw
    if isinstance(value, bytes):
        return header(len(value), None, 0, [(0xC4, ">B"), (0xC5, ">H"), (0xC6, ">I")]) + value
    if isinstance(value, dict):
        body = b"".join(encode(k, rng) + encode(v, rng) for k, v in value.items())
        return header(len(value), 0x80, 15, [(0xDE, ">H"), (0xDF, ">I")]) + body
    body = b"".join(encode(v, rng) for v in value)
    return header(len(value), 0x90, 15, [(0xDC, ">H"), (0xDD, ">I")]) + body


#: an object whose header claims more than any payload here holds: msgpack's error names
#: a limit that follows the payload's length, so it differs if the payload was rewritten
OVERLONG = [b"\xdd\x00\x00\xff\xff", b"\xdb\x00\x00\xff\xff", b"\xc6\x00\x01\x00\x00",
            b"\xdf\x00\x00\xff\xff"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    evs=st.lists(vllm_event(), max_size=4),
    batch_map=st.booleans(),
    seed=st.integers(0, 2**32),
    last=st.sampled_from([b"", *OVERLONG]),
    junk=st.binary(max_size=3),
)
@pytest.mark.slow
def test_any_encoding_cut_or_mutated_decodes_alike(
    evs: list[Any], batch_map: bool, seed: int, last: bytes, junk: bytes
) -> None:
    """Ids in any int width, headers in any width, an overlong object after the events,
    bytes after the batch, a cut anywhere, a byte changed anywhere: the same events, or the
    same error, as the plain decode."""
    rng = random.Random(seed)
    if batch_map:
        fields = [("ts", 1.5), ("events", evs), ("n", [1])]
        payload = bytes([0x80 | (len(fields) + bool(last))]) + b"".join(
            encode(k, rng) + encode(v, rng) for k, v in fields
        )
        payload += encode("z", rng) + last if last else b""
    else:
        items = [1.5, evs, 0, "x"]
        payload = bytes([0x90 | (len(items) + bool(last))])
        payload += b"".join(encode(v, rng) for v in items) + last
    same(payload)
    same(payload + junk)
    same(payload[: rng.randrange(len(payload) + 1)])
    mutated = bytearray(payload)
    for _ in range(rng.randint(1, 3)):
        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
    same(bytes(mutated))
