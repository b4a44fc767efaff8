"""U64Map (native/_u64map.c) and DictMap answer like a plain dict of ints.

The reference is deliberately plain: a dict, one Python step per key, its insertion order
the order eviction follows. Random operations on small key spaces (so that keys collide,
are deleted, come back, and indexes grow and shrink) run on all three, compared after every
step; a long churn on one map squeezes its entries many times."""

from __future__ import annotations

import pickle
import random
import sys
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heimdall_proxy.conductor import tables
from heimdall_proxy.conductor.tables import DictMap, as_dict_map, new_map

if not tables.NATIVE:  # pragma: no cover - pip install -e . builds it
    pytest.fail("native/_u64map.c is not built", pytrace=False)

from heimdall_proxy.native._u64map import U64Map

U64 = (1 << 64) - 1


class Plain:
    """The reference: a dict, written one key at a time."""

    def __init__(self) -> None:
        self.d: dict[int, int] = {}

    def set_many(self, keys: list[int], values: list[int]) -> None:
        for k, v in zip(keys, values, strict=False):
            self.d[k] = v

    def or_bits(self, keys: list[int], bit: int) -> None:
        for k in keys:
            self.d[k] = self.d.get(k, 0) | bit

    def unset_bits(self, keys: list[int], bit: int) -> int:
        n = 0
        for k in keys:
            if k in self.d and self.d[k] & bit:
                n += 1
                self.d[k] &= ~bit
                if not self.d[k]:
                    del self.d[k]
        return n

    def drop_bits(self, bit: int) -> int:
        return self.unset_bits(list(self.d), bit)

    def evict_oldest(self, max_keys: int) -> int:
        if len(self.d) <= max_keys:
            return 0
        n = min(len(self.d), len(self.d) - max_keys + max(1, max_keys // 64))
        for k in list(self.d)[:n]:
            del self.d[k]
        return n

    def clear(self) -> None:
        self.d.clear()


def run(ops: list[tuple[Any, ...]]) -> None:
    plain, native, wrapped = Plain(), U64Map(), DictMap()
    for op, *args in ops:
        want = getattr(plain, op)(*args)
        assert getattr(native, op)(*args) == want, op
        assert getattr(wrapped, op)(*args) == want, op
        items = list(plain.d.items())
        assert native.items() == items and list(wrapped.items()) == items, op
        assert len(native) == len(plain.d) and native == plain.d and native == wrapped
    for key in range(40):  # reads, present or not
        assert native.get(key) == plain.d.get(key) and (key in native) == (key in plain.d)
        assert native.get(key, 0) == plain.d.get(key, 0)
    probe = [*range(45), -1, 1 << 64, "x"]
    want = [plain.d.get(k, 0) for k in probe[:45]] + [0, 0, 0]
    assert native.get_many(probe, 0) == want and wrapped.get_many(probe, 0) == want
    clone = pickle.loads(pickle.dumps(native))
    assert clone.items() == native.items() and clone == native


keys = st.lists(st.integers(0, 39), max_size=40)
bits = st.sampled_from([1, 2, 4, 1 << 40, 1 << 63])
op = st.one_of(
    st.tuples(st.just("set_many"), keys, st.lists(st.integers(0, U64), max_size=40)),
    st.tuples(st.just("or_bits"), keys, bits),
    st.tuples(st.just("unset_bits"), keys, bits),
    st.tuples(st.just("drop_bits"), bits),
    st.tuples(st.just("evict_oldest"), st.integers(0, 30)),
    st.tuples(st.just("clear")),
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_random_operations_answer_like_a_dict(ops: list[tuple[Any, ...]]) -> None:
    run(ops)


@pytest.mark.slow
def test_large_maps_grow_delete_evict_and_shrink_like_a_dict() -> None:
    """Tens of thousands of keys: rehashes, long probe runs, deletions that shift runs back
    over the table's end, order queues filtered after deletions and after evictions."""
    rng = random.Random(7)
    universe = [rng.getrandbits(64) for _ in range(20_000)] + list(range(5_000))
    ops: list[tuple[Any, ...]] = []
    for _ in range(400):
        ks = rng.sample(universe, rng.randint(1, 200))
        r = rng.random()
        if r < 0.45:
            ops.append(("or_bits", ks, rng.choice([1, 2, 4])))
        elif r < 0.6:
            ops.append(("set_many", ks, [rng.getrandbits(64) for _ in ks]))
        elif r < 0.85:
            ops.append(("unset_bits", ks, rng.choice([1, 2, 4])))
        elif r < 0.95:
            ops.append(("evict_oldest", rng.randint(2_000, 12_000)))
        else:
            ops.append(("drop_bits", rng.choice([1, 2])))
    run(ops)


def test_a_long_churn_squeezes_the_entries_and_keeps_the_order() -> None:
    """Keys written, deleted and written again on one long-lived map: the entries array
    fills with dead ones and is squeezed, the index rebuilt over the moved positions."""
    rng = random.Random(11)
    plain, native = Plain(), U64Map()
    live: list[int] = []
    for step in range(3_000):
        new = [rng.getrandbits(64) if rng.random() < 0.8 else rng.randrange(64) for _ in range(8)]
        plain.or_bits(new, 1)
        native.or_bits(new, 1)
        live = list(plain.d)
        gone = rng.sample(live, min(len(live), rng.randint(0, 9)))
        assert native.unset_bits(gone, 1) == plain.unset_bits(gone, 1)
        if step % 500 == 0:
            assert native.evict_oldest(400) == plain.evict_oldest(400)
        if step % 97 == 0:
            assert native.items() == list(plain.d.items())
    assert native.keys() == list(plain.d) == list(native)
    assert native.items() == list(plain.d.items()) and native == plain.d


def test_buffers_of_u64_are_read_as_keys_and_values() -> None:
    m = U64Map()
    m.set_many(array("Q", [1, 2, U64]), array("Q", [10, 20, 30]))
    m.or_bits(array("Q", [2, 3]), 1)
    assert m.items() == [(1, 10), (2, 21), (U64, 30), (3, 1)]
    assert m.unset_bits(array("Q", [3, 4]), 1) == 1 and 3 not in m
    with pytest.raises(TypeError, match="u64"):
        m.or_bits(array("I", [1]), 1)  # u32: not keys


def test_writes_refuse_what_a_u64_cannot_hold_and_reads_find_nothing() -> None:
    m = U64Map()
    m.set_many([5], [6])
    for bad in (-1, 1 << 64):
        with pytest.raises(OverflowError):
            m.set_many([bad], [1])
        with pytest.raises(OverflowError):
            m.set_many([7], [bad])
        with pytest.raises(OverflowError):
            m.or_bits([bad], 1)
        assert m.get(bad) is None and bad not in m and m.unset_bits([bad], 1) == 0
    with pytest.raises(TypeError):
        m.or_bits(["5"], 1)
    with pytest.raises(ValueError, match="bit"):
        m.or_bits([5], 0)
    assert m.get("5", "absent") == "absent" and m[5] == 6
    with pytest.raises(KeyError):
        m[7]
    assert m.items() == [(5, 6)]  # nothing of a refused chunk: its keys are read first
    assert repr(m) == "U64Map(<1 keys>)"


def test_memory_is_given_back_when_most_keys_go() -> None:
    m = U64Map()
    m.or_bits(list(range(100_000)), 1)
    m.or_bits(list(range(10)), 2)
    big = sys.getsizeof(m)
    assert m.drop_bits(1) == 100_000 and len(m) == 10
    assert sys.getsizeof(m) < big / 100 and m.items() == [(k, 2) for k in range(10)]
    m.clear()
    assert len(m) == 0 and sys.getsizeof(m) < 200 and m.items() == []


def test_as_dict_map_keeps_the_order_and_new_map_follows_the_build() -> None:
    m = new_map()
    assert type(m) is U64Map and type(new_map(wide=True)) is DictMap
    m.set_many([3, 1, 2], [30, 10, 20])
    d = as_dict_map(m)
    assert type(d) is DictMap and list(d.items()) == [(3, 30), (1, 10), (2, 20)]
    assert as_dict_map(d) is d
