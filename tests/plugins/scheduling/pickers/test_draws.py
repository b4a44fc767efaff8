"""uniforms(): n draws at once, the same floats and generator state as n calls."""

from __future__ import annotations

import random

import pytest

from heimdall_proxy.plugins.scheduling.pickers.draws import uniforms


@pytest.mark.parametrize("n", [0, 1, 2, 3, 48, 1024, 5000])
def test_the_draws_are_those_of_n_calls_and_the_generator_ends_where_they_would(n: int) -> None:
    for seed in range(20):
        calls, batch = random.Random(seed), random.Random(seed)
        want = [calls.random() for _ in range(n)]
        assert uniforms(batch, n).tolist() == want, seed
        assert batch.random() == calls.random()  # the state after: the same next draw


def test_after_other_use_of_the_generator() -> None:
    calls, batch = random.Random(7), random.Random(7)
    for r in (calls, batch):
        r.getrandbits(17)
        r.random()
    assert uniforms(batch, 100).tolist() == [calls.random() for _ in range(100)]


def test_a_generator_that_draws_its_own_way_is_called() -> None:
    class Halves(random.Random):
        def random(self) -> float:
            return 0.5

    assert uniforms(Halves(1), 4).tolist() == [0.5] * 4
