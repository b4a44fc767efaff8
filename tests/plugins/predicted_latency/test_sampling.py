"""The TPOT token sampler: token 2 first, then Poisson intervals of the configured mean,
never a zero interval; a non-positive mean is refused."""

from __future__ import annotations

import pytest

from heimdall_proxy.plugins.predicted_latency.sampling import TokenSampler


def test_intervals_have_the_configured_mean() -> None:
    sampler = TokenSampler(20.0, seed=1)
    assert sampler.first() == 2
    token, gaps = 2, []
    for _ in range(4000):
        nxt = sampler.after(token)
        gaps.append(nxt - token)
        token = nxt
    mean = sum(gaps) / len(gaps)
    assert 19.0 < mean < 21.0
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    assert 15.0 < var < 25.0  # Poisson: variance = mean (an exponential gap would give ~400)


def test_a_tiny_mean_samples_every_token_never_the_same_one_twice() -> None:
    sampler = TokenSampler(0.001, seed=2)
    assert [sampler.after(t) for t in range(2, 7)] == [3, 4, 5, 6, 7]


@pytest.mark.parametrize("mean", [0.0, -1.0, float("nan")])
def test_a_non_positive_mean_is_refused(mean: float) -> None:
    with pytest.raises(ValueError, match="samplingMean"):
        TokenSampler(mean)
