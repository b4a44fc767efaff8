"""ConductorIndex: runs per medium and DP rank, namespaces kept apart, engine hashes mapped
for removals, clears and dropped sources."""

from __future__ import annotations

import sys

import pytest

from heimdall_proxy.conductor.hashing import seq_hashes
from heimdall_proxy.conductor.index import ConductorIndex
from heimdall_proxy.conductor.model import Cleared, Namespace, Removed, Stored, Stream
from heimdall_proxy.conductor.tables import DictMap
from tests.helpers import TOKENS

NS = Namespace("m", 4, "", "", "default")
KEYS = seq_hashes(TOKENS, 4)
pytestmark = pytest.mark.usefixtures("map_kind")  # each test on U64Map, then on DictMap


def stream(backend: str = "a", medium: str = "gpu", rank: int = 0, ns: Namespace = NS) -> Stream:
    return Stream(ns, backend, medium, rank)


def test_runs_per_medium_and_rank() -> None:
    index = ConductorIndex(1337)
    index.stored("p0", Stored(stream("a", "gpu", 0), 1, KEYS[:2]))
    index.stored("p0", Stored(stream("a", "cpu", 0), 2, KEYS[:5]))
    index.stored("p1", Stored(stream("a", "gpu", 1), 1, KEYS[:6]))
    index.stored("p2", Stored(stream("b", "disk", 0), 1, KEYS[:3]))
    index.stored("p2", Stored(stream("b", "cxl", 0), 1, KEYS[:1]))
    hits = index.query(NS, KEYS, ["a", "b"])
    assert hits["a"].longest == 6 and hits["a"].dp == {0: 5, 1: 6}
    assert hits["a"].media == {"gpu": 6, "cpu": 5}
    assert hits["b"].longest == 3 and hits["b"].media == {"disk": 3, "cxl": 1}
    # a run across media is continuous: gpu for blocks 0-1 and cpu after still counts
    index.stored("p3", Stored(stream("c", "gpu"), 1, KEYS[:2]))
    index.stored("p3", Stored(stream("c", "cpu"), 2, KEYS[2:4]))
    assert index.query(NS, KEYS, ["c"])["c"].longest == 4
    assert index.query(NS, KEYS, ["b"]).keys() == {"b"}  # only the backends asked about
    assert index.query(NS, seq_hashes(list(range(32)), 4), ["a"]) == {}  # a cold prompt


def test_namespaces_are_kept_apart() -> None:
    index = ConductorIndex(1337)
    index.stored("p", Stored(stream(), 1, KEYS))
    for other in (
        Namespace("m", 4, "w8a8", "", "default"),
        Namespace("m", 4, "", "sql", "default"),
        Namespace("m", 4, "", "", "tenant-b"),
        Namespace("other", 4, "", "", "default"),
        Namespace("m", 8, "", "", "default"),
    ):
        assert index.query(other, KEYS, ["a"]) == {}
    assert index.query(NS, KEYS, ["a"])["a"].longest == 8


def test_engine_hashes_are_mapped_for_removal_and_parents() -> None:
    index = ConductorIndex(1337)
    # an engine with its own hashes (10, 11) sends the tokens; blocks of 8 = two of ours
    index.stored("p", Stored(stream(), 1, [10, 11], token_ids=TOKENS[:16], engine_block_size=8))
    index.stored("p", Stored(stream(), 2, [12], parent_hash=11, token_ids=TOKENS[16:24],
                             engine_block_size=8))  # fmt: skip
    assert index.query(NS, KEYS, ["a"])["a"].longest == 6
    index.stored("p", Stored(stream(), 3, [99], parent_hash=98, token_ids=TOKENS[24:32],
                             engine_block_size=8))  # fmt: skip
    assert index.stats.orphan_events == 1
    index.removed("p", Removed(stream(), 4, [11, 12345]), engine_hashes=True)
    assert index.query(NS, KEYS, ["a"])["a"].longest == 2
    assert index.stats.removed_blocks == 2 and index.stats.unknown_removals == 1
    # an offloading event (no tokens) moves known blocks to another medium
    index.stored("p", Stored(stream(medium="cpu"), 5, [10, 11], token_ids=[]))
    assert index.query(NS, KEYS, ["a"])["a"].media == {"gpu": 2, "cpu": 4}


def test_engine_blocks_of_several_keys_and_signed_engine_hashes_keep_their_maps() -> None:
    """Entries a U64Map cannot hold (a tuple of keys, a negative hash from an engine that
    hashes with Python's signed hash()) move the publisher's map to a DictMap, whole."""
    index = ConductorIndex(1337)
    index.stored("p", Stored(stream(), 1, [-5, 7], token_ids=TOKENS[:8]))
    index.stored("p", Stored(stream(), 2, [-6], parent_hash=7, token_ids=TOKENS[8:12]))
    index.stored("q", Stored(stream("b"), 1, [1], token_ids=TOKENS[:8], engine_block_size=8))
    assert type(index.engines.maps["p"][NS]) is DictMap
    assert type(index.engines.maps["q"][NS]) is DictMap
    assert index.query(NS, KEYS, ["a", "b"])["a"].longest == 3
    assert index.removed("p", Removed(stream(), 3, [7, -6]), engine_hashes=True) == 2
    assert index.query(NS, KEYS, ["a", "b"])["a"].longest == 1
    assert index.query(NS, KEYS, ["b"])["b"].longest == 2
    assert index.removed("q", Removed(stream("b"), 2, [1]), engine_hashes=True) == 2


def test_a_65th_source_widens_the_namespace_maps() -> None:
    index = ConductorIndex(1337)
    want = {f"b{i}": 1 + i % 7 for i in range(70)}
    for backend, n in want.items():
        index.stored(backend, Stored(stream(backend), 1, KEYS[:n]))
    index.stored("b69", Stored(stream("b69", "cpu"), 2, KEYS[:8]))  # made after: wide too
    media = index.spaces[NS].media
    assert all(type(d) is DictMap for d in media.values())
    hits = index.query(NS, KEYS, list(want))
    assert {b: h.dp[0] for b, h in hits.items()} == {**want, "b69": 8}
    assert hits["b69"].media == {"gpu": want["b69"], "cpu": 8}
    assert index.cleared("b3", Cleared(stream("b3"), 3)) == want["b3"]
    assert "b3" not in index.query(NS, KEYS, list(want))


def test_cleared_and_dropped_sources() -> None:
    index = ConductorIndex(1337)
    index.stored("p", Stored(stream("a", "gpu"), 1, KEYS))
    index.stored("p", Stored(stream("a", "cpu"), 2, KEYS))
    index.stored("q", Stored(stream("b", "gpu"), 1, KEYS))
    index.cleared("p", Cleared(stream("a", "gpu"), 3))
    assert index.query(NS, KEYS, ["a", "b"])["a"].media == {"cpu": 8}
    index.cleared("p", Cleared(stream("a", "gpu"), 4, all_namespaces=True, all_media=True))
    assert index.query(NS, KEYS, ["a", "b"]).keys() == {"b"}
    assert index.drop_source("default", ("b", 0)) == 8
    assert index.query(NS, KEYS, ["a", "b"]) == {} and index.blocks_per_medium() == {}


def test_dropping_a_bit_keeps_order_and_gives_memory_back() -> None:
    index = ConductorIndex(1337)
    many = seq_hashes(list(range(4 * 300)), 4)
    index.stored("p", Stored(stream("a"), 1, many))  # a holds 300 keys, b the first 8
    index.stored("q", Stored(stream("b"), 1, many[:8]))
    space = index.spaces[NS]
    size = sys.getsizeof(space.media["gpu"])
    # a sole source's medium is emptied; here b also holds keys: the scan, then a smaller
    # table, since most of the keys went
    assert index.cleared("p", Cleared(stream("a"), 2)) == 300
    assert list(space.media["gpu"]) == many[:8] and sys.getsizeof(space.media["gpu"]) < size / 4
    assert index.query(NS, many, ["a", "b"]).keys() == {"b"}
    index.stored("p", Stored(stream("a"), 3, many[:8]))
    gpu = space.media["gpu"]
    index.cleared("q", Cleared(stream("b"), 2))  # no key lost all its sources: in place
    assert space.media["gpu"] is gpu and list(gpu) == many[:8]  # order kept: eviction reads it
    assert index.query(NS, many, ["a", "b"]).keys() == {"a"}
    assert index.drop_source("default", ("b", 0)) == 0
    assert index.drop_source("default", ("a", 0)) == 8  # the sole source left: emptied in C
    assert not gpu and NS not in index.spaces


def test_bounded_per_medium() -> None:
    index = ConductorIndex(1337, max_keys=64)
    many = seq_hashes(list(range(4 * 200)), 4)
    index.stored("p", Stored(stream(), 1, many))
    assert index.blocks_per_medium()["gpu"] <= 64 and index.stats.evicted_keys > 0


def test_the_services_seed_keys_queries_and_token_events() -> None:
    from heimdall_proxy.conductor.api import parse_query
    from heimdall_proxy.conductor.model import Registration
    from heimdall_proxy.conductor.service import Conductor, ServiceOptions

    conductor = Conductor(ServiceOptions(hash_seed=7))
    reg = Registration("tcp://h:1", None, "vLLM", "m", "", "default", "a", 4, 0, "")
    conductor.registrations[reg.key] = reg
    conductor.index.stored(reg.key, Stored(stream(), 1, [5, 6], token_ids=TOKENS[:8]))
    ns = Namespace("m", 4, "", "", "default")
    assert conductor.index.query(ns, seq_hashes(TOKENS[:8], 4, 7), ["a"])["a"].longest == 2
    assert conductor.index.query(ns, seq_hashes(TOKENS[:8], 4), ["a"]) == {}
    body = {"model": "m", "block_size": 4, "token_ids": TOKENS[:8]}
    _, hits = conductor.query(parse_query(body, False, 100, 100))
    assert hits["a"].longest == 2
