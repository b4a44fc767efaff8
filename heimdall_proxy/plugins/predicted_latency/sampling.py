"""Which tokens of a stream TPOT is sampled at (GIE's `samplingMean`, streaming mode).

GIE's latency predictor samples a stream's inter-token latency at token 2 (the first one
after the TTFT) and then at token indices spaced by intervals drawn from a Poisson
distribution whose mean is `samplingMean` (default 1000, so most streams are sampled at
token 2 and, here, at their end), at most `maxSampledTokens` times a stream. We keep
those token indices; what is recorded at each is the mean time per token since the first
token, which is less noisy than one inter-token gap and is what the TPOT model predicts.

The draws come from numpy's Poisson sampler (exact for every mean) on one generator per
producer: a stream needs one draw per sample, and the seed need not be reproducible."""

from __future__ import annotations

import numpy as np

#: The first token sampled: token 1 is the first token (its latency is the TTFT).
FIRST_SAMPLED_TOKEN = 2


class TokenSampler:
    """Draws the token indices of the TPOT samples of streams. Not thread-safe (the
    gateway's event loop only)."""

    __slots__ = ("_rng", "mean")

    def __init__(self, mean: float, seed: int | None = None) -> None:
        if not mean > 0.0:
            raise ValueError(f"samplingMean must be > 0, got {mean}")
        self.mean = mean
        self._rng = np.random.default_rng(seed)

    def first(self) -> int:
        """The index of a stream's first sampled token."""
        return FIRST_SAMPLED_TOKEN

    def after(self, token: int) -> int:
        """The index of the sample after one taken at `token`: a Poisson interval of mean
        `mean`, at least one token (a zero interval would sample the same token again)."""
        return token + max(1, int(self._rng.poisson(self.mean)))
