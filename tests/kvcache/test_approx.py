"""The approximate prefix index: per-pod LRU capacity, consecutive matches."""

from __future__ import annotations

import random

from heimdall_proxy.kvcache.approx import ApproxPrefixIndex


def test_match_counts_leading_keys_per_pod() -> None:
    idx = ApproxPrefixIndex(100)
    idx.add("a", [1, 2, 3, 4])
    idx.add("b", [1, 2])
    idx.add("c", [2, 3, 4])  # holds later blocks, not the first: no match
    assert idx.match([1, 2, 3, 4, 5], ["a", "b", "c", "d"]) == {"a": 4, "b": 2}
    assert idx.match([1, 2, 3], ["a"]) == {"a": 3}
    assert idx.match([9, 1], ["a", "b"]) == {}
    assert idx.match([], ["a"]) == {}


def test_lru_capacity_evicts_the_least_recently_added() -> None:
    idx = ApproxPrefixIndex(3)
    idx.add("a", [1, 2, 3])
    idx.add("a", [1])  # refreshes 1
    idx.add("a", [4])  # evicts 2
    assert idx.size("a") == 3
    assert idx.match([1, 2], ["a"]) == {"a": 1}
    assert idx.match([1, 3, 4], ["a"]) == {"a": 3}
    idx.add("a", [5, 6, 7], capacity=2)
    assert idx.size("a") == 2
    assert len(idx) == 2


def test_forget_drops_a_pod() -> None:
    idx = ApproxPrefixIndex(10)
    idx.add("a", [1, 2])
    idx.add("b", [1])
    idx.forget("a")
    idx.forget("zzz")
    assert idx.match([1, 2], ["a", "b"]) == {"b": 1}
    assert len(idx) == 1


def test_match_of_a_set_equals_the_match_of_a_list() -> None:
    """A frozenset of candidates (what the prefix scorer passes) is matched exactly as the
    same names in a list, both as counted by hand, and is not modified."""
    rng = random.Random(8)
    idx = ApproxPrefixIndex(100)
    held = {f"p{i}": rng.randrange(0, 8) for i in range(30)}
    for pod, n in held.items():
        if n:
            idx.add(pod, list(range(n)))
    for _ in range(50):
        keys = list(range(rng.randrange(0, 10)))
        names = rng.sample(sorted(held), rng.randrange(1, 30))
        want = {p: min(held[p], len(keys)) for p in names if min(held[p], len(keys)) > 0}
        frozen = frozenset(names)
        assert idx.match(keys, frozen) == want
        assert idx.match(keys, names) == want
        assert frozen == frozenset(names)
