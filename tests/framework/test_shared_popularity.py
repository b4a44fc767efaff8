"""The prefix popularity counted over every replica's requests (framework/popularity.py)."""

from __future__ import annotations

import msgpack
import pytest

from heimdall_proxy.framework.popularity import MAX_PENDING, PrefixPopularity, SharedPopularity


def exchange(src: SharedPopularity, dst: SharedPopularity) -> None:
    """One push from src to dst, through msgpack as on the wire."""
    payload = src.outgoing()
    if payload is not None:
        dst.incoming(msgpack.unpackb(msgpack.packb(payload)))


def test_two_replicas_count_what_one_gateway_counts() -> None:
    """Requests dealt to two replicas in turn, exchanged after every pair: each replica's
    count is one gateway's that saw them all (the order within a pair aside)."""
    one = PrefixPopularity(half_life=8.0)
    a = SharedPopularity(PrefixPopularity(half_life=8.0))
    b = SharedPopularity(PrefixPopularity(half_life=8.0))
    alone = PrefixPopularity(half_life=8.0)  # a replica that shares nothing
    keys = [7 if i % 3 else None for i in range(60)] + [9] * 10
    for i, key in enumerate(keys):
        one.observe(key)
        (a if i % 2 == 0 else b).observe(key)
        if i % 2 == 0:
            alone.observe(key)
        if i % 2 == 1:
            exchange(a, b)
            exchange(b, a)
    for key in (7, 9):
        assert a.popularity.count(key) == pytest.approx(one.count(key), rel=0.1)
        assert b.popularity.count(key) == pytest.approx(one.count(key), rel=0.1)
    # one replica's own half alone counts the warming prefix 9 well below one gateway
    assert alone.count(9) < 0.7 * one.count(9)


def test_a_push_takes_the_pending_requests_once() -> None:
    s = SharedPopularity(PrefixPopularity())
    assert s.outgoing() is None
    s.observe(5)
    s.observe(None)
    s.observe(2**70)  # outside msgpack's range: counted here only
    assert s.outgoing() == [5, None]
    assert s.outgoing() is None
    assert s.popularity.count(2**70) == 1.0


def test_pending_requests_are_bounded() -> None:
    s = SharedPopularity(PrefixPopularity())
    for _ in range(MAX_PENDING + 10):
        s.observe(1)
    out = s.outgoing()
    assert out is not None and len(out) == MAX_PENDING


@pytest.mark.parametrize(
    "payload",
    [b"x", {"a": 1}, [1, "two"], [1, 2.5], [True], [[1]], [0] * (MAX_PENDING + 1)],
)
def test_a_bad_payload_is_refused_whole(payload: object) -> None:
    s = SharedPopularity(PrefixPopularity())
    with pytest.raises((TypeError, ValueError)):
        s.incoming(payload)
    assert len(s.popularity) == 0
    assert s.popularity.count(0) == 0.0
