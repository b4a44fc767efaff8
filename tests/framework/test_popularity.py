"""Decayed counts of the recent requests that shared each prefix."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.popularity import PrefixPopularity


def test_the_count_returned_includes_the_request_itself() -> None:
    p = PrefixPopularity()
    assert p.observe(None) == 0.0
    assert p.observe(1) == 1.0
    assert p.observe(1) == pytest.approx(1.0 + 0.5 ** (1 / 64))


def test_a_prefix_every_other_request_shares_counts_about_a_half_life_of_them() -> None:
    p = PrefixPopularity(half_life=32)
    for i in range(400):
        p.observe(7 if i % 2 else i + 100)
    # the steady state of +1 every second request, halving every 32: 1 / (1 - 0.5 ** (2/32))
    assert p.count(7) == pytest.approx(1 / (1 - 0.5 ** (2 / 32)), rel=0.03)
    assert p.count(101) < 0.01  # one request, long ago


def test_a_prefix_that_stops_coming_fades_and_is_forgotten() -> None:
    p = PrefixPopularity(half_life=16)
    for _ in range(50):
        p.observe(1)
    before = p.count(1)
    for _ in range(16):
        p.observe(2)
    assert p.count(1) == pytest.approx(before / 2)  # one half-life later
    for _ in range(200):
        p.observe(None)
    assert p.count(1) < 0.01
    assert len(p) == 0  # swept: memory holds only recent keys


def test_memory_is_bounded_by_recent_keys() -> None:
    p = PrefixPopularity(half_life=16)
    for i in range(10_000):
        p.observe(i)  # every request a new prefix
    assert len(p) < 16 * 8
