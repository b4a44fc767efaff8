"""The TTFT and TPOT models of one gateway and the features they read.

Features are what the gateway knows of a pod when it schedules, cheaply: the last scrape
(waiting and running requests, KV-cache use), the request (prompt tokens, how many of them
the pod holds in its prefix cache, expected output) and the gateway's own in-flight ledger,
which is fresher than any scrape. They are scaled by fixed constants to magnitudes near 1,
which is what plain SGD needs to converge without a scaler in front."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.latency.model import OnlineLatencyModel

FEATURES = (
    "waiting/8",
    "running/32",
    "kv_cache_usage",
    "prompt_tokens/1000",
    "uncached_prompt_tokens/1000",
    "inflight_requests/8",
    "inflight_prompt_tokens/4000",
    "output_tokens/100",
)


def features(
    endpoint: Endpoint,
    prompt_tokens: int,
    uncached_tokens: int,
    inflight: int,
    inflight_tokens: float,
    output_tokens: int,
) -> list[float]:
    """One feature row (see FEATURES)."""
    m = endpoint.metrics
    return [
        m.waiting / 8.0,
        m.running / 32.0,
        m.kv_cache_usage,
        prompt_tokens / 1000.0,
        uncached_tokens / 1000.0,
        inflight / 8.0,
        inflight_tokens / 4000.0,
        output_tokens / 100.0,
    ]


class LatencyPredictor:
    """A TTFT model and a TPOT model over the same features. TTFT means end-to-end latency
    when the owner trains it so (non-streaming mode); the TPOT model then stays untrained
    and `predict` returns no TPOT."""

    __slots__ = ("tpot", "ttft")

    def __init__(self, *, min_samples: int = 8, batch_size: int = 8) -> None:
        n = len(FEATURES)
        self.ttft = OnlineLatencyModel(n, min_samples=min_samples, batch_size=batch_size)
        self.tpot = OnlineLatencyModel(n, min_samples=min_samples, batch_size=batch_size)

    def predict(
        self, pods: Sequence[str], rows: Sequence[Sequence[float]]
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(TTFT seconds per pod or None while untrained, TPOT seconds or None)."""
        if not self.ttft.ready:
            return None, None
        x = np.asarray(rows, dtype=float)
        ttft = self.ttft.predict(pods, x)
        tpot = self.tpot.predict(pods, x) if self.tpot.ready else None
        return ttft, tpot
