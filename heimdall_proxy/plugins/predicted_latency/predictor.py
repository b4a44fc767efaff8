"""The TTFT and TPOT models of one gateway and the features they read.

Features are what the gateway knows of a pod when it schedules, cheaply: the last scrape
(waiting and running requests, KV-cache use), the request (prompt tokens, how many of them
the pod holds in its prefix cache, expected output) and the gateway's own in-flight ledger,
which is fresher than any scrape. They are scaled by fixed constants to magnitudes near 1,
which keeps the rows readable (the regression standardizes them again, model.py).

Prediction runs once per request over every candidate, so it is built for that: the feature
matrix is filled column by column (the scraped columns of a pod are computed once per
scrape, the request's columns are one broadcast each), and both models are applied with
one matrix product."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from itertools import compress
from operator import attrgetter, is_not

import numpy as np

from heimdall_proxy.framework.types import Endpoint, Metrics, watch_metrics
from heimdall_proxy.plugins.predicted_latency.model import MIN_PREDICTION, OnlineLatencyModel

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
_METRICS = attrgetter("metrics")
_WAITING = attrgetter("waiting")
_RUNNING = attrgetter("running")
_KV = attrgetter("kv_cache_usage")
#: Column scales, in FEATURES order.
_SCALE = (8.0, 32.0, 1.0, 1000.0, 1000.0, 8.0, 4000.0, 100.0)
#: The scales of the waiting and in-flight columns: powers of two, so a column times its
#: scale is the count again, exactly (readers recover the counts from the rows).
WAITING_SCALE = _SCALE[0]
INFLIGHT_SCALE = _SCALE[5]


def features(
    endpoint: Endpoint,
    prompt_tokens: int,
    uncached_tokens: int,
    inflight: int,
    inflight_tokens: float,
    output_tokens: int,
) -> list[float]:
    """One feature row (see FEATURES); FeatureMatrix builds the same rows for many pods."""
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


class FeatureMatrix:
    """Builds the feature rows of all candidates at once. The scraped columns change only
    when a pod's Metrics object is replaced (every scrape replaces it whole), so those of
    the last candidate list are kept, and updated by the writer as it replaces a snapshot
    (`metrics_replaced`, via `watch_metrics`): while the candidates are the same list, a
    request reads no pod's snapshot at all (right after a pool-wide refresh re-reading 1,024
    rows was a third of a decision). Another list is compared by snapshot identity with the
    kept one, and only the rows whose object differs are read again."""

    __slots__ = ("__weakref__", "_endpoints", "_metrics", "_rows", "_scraped")

    def __init__(self) -> None:
        #: the snapshots the rows were read from, held so that a new one is another object
        self._metrics: list[Metrics] = []
        self._scraped = np.empty((0, 3))
        #: the candidate list the rows are of, kept current as its pods are scraped
        self._endpoints: Sequence[Endpoint] | None = None
        self._rows: dict[Endpoint, int] = {}
        watch_metrics(self)

    def metrics_replaced(self, endpoint: Endpoint, metrics: Metrics) -> None:
        """A scrape replaced `endpoint`'s snapshot: its row, if it has one, is read now."""
        i = self._rows.get(endpoint)
        if i is not None:
            self._metrics[i] = metrics
            row = self._scraped[i]
            row[0] = metrics.waiting / _SCALE[0]
            row[1] = metrics.running / _SCALE[1]
            row[2] = metrics.kv_cache_usage / _SCALE[2]

    def _scraped_columns(self, endpoints: Sequence[Endpoint]) -> np.ndarray:
        if endpoints is self._endpoints and len(endpoints) == len(self._metrics):
            return self._scraped  # kept current as its pods were scraped
        metrics = list(map(_METRICS, endpoints))
        n = len(metrics)
        if metrics != self._metrics:  # identity first: the same snapshots compare in C
            # the positions whose snapshot is another object: compared in C, no id() per pod
            changed = (
                list(compress(range(n), map(is_not, metrics, self._metrics)))
                if n == len(self._metrics)
                else None
            )
            if changed is None or len(changed) * 4 > n:
                scraped = np.empty((n, 3))
                scraped[:, 0] = np.fromiter(map(_WAITING, metrics), float, n)
                scraped[:, 1] = np.fromiter(map(_RUNNING, metrics), float, n)
                scraped[:, 2] = np.fromiter(map(_KV, metrics), float, n)
                scraped /= _SCALE[:3]
                self._scraped = scraped
            else:
                scraped = self._scraped
                for i in changed:
                    m = metrics[i]
                    scraped[i] = (m.waiting, m.running, m.kv_cache_usage)
                    scraped[i] /= _SCALE[:3]
            self._metrics = metrics
        # follow this list's pods from now on (a pod listed twice: compared per request)
        rows = {e: i for i, e in enumerate(endpoints)}
        if len(rows) == n:
            self._endpoints, self._rows = endpoints, rows
        else:
            self._endpoints, self._rows = None, {}
        return self._scraped

    def build(
        self,
        endpoints: Sequence[Endpoint],
        prompt_tokens: int,
        uncached_tokens: Sequence[float] | np.ndarray | None,
        inflight: Sequence[int] | np.ndarray,
        inflight_tokens: Sequence[float] | np.ndarray,
        output_tokens: int,
    ) -> np.ndarray:
        """Rows in `endpoints` order; `uncached_tokens` None means no pod holds any of the
        prompt."""
        scraped = self._scraped_columns(endpoints)
        x = np.empty((len(endpoints), len(FEATURES)))
        x[:, 0:3] = scraped
        x[:, 3] = prompt_tokens / _SCALE[3]
        if uncached_tokens is None:
            x[:, 4] = prompt_tokens / _SCALE[4]
        else:
            x[:, 4] = uncached_tokens
            x[:, 4] /= _SCALE[4]
        x[:, 5] = inflight
        x[:, 5] /= _SCALE[5]
        x[:, 6] = inflight_tokens
        x[:, 6] /= _SCALE[6]
        x[:, 7] = output_tokens / _SCALE[7]
        return x


class LatencyPredictor:
    """A TTFT model and a TPOT model over the same features. TTFT means end-to-end latency
    when the owner trains it so (non-streaming mode); the TPOT model then stays untrained
    and `predict` returns no TPOT."""

    __slots__ = ("_factors", "_factors_at", "_stacked", "_stacked_at", "tpot", "ttft")

    def __init__(self, *, min_samples: int = 8, batch_size: int = 8) -> None:
        n = len(FEATURES)
        self.ttft = OnlineLatencyModel(n, min_samples=min_samples, batch_size=batch_size)
        self.tpot = OnlineLatencyModel(n, min_samples=min_samples, batch_size=batch_size)
        self._stacked = np.zeros((n + 1, 2))
        self._stacked_at = (-1, -1)
        self._factors = np.empty((0, 2))
        self._factors_at: tuple[Sequence[str], int, int] = ((), -1, -1)

    def train_on(self, trainer: Executor | None) -> None:
        """Fit full batches of both models on `trainer` (one worker), not where they fill up."""
        self.ttft.trainer = trainer
        self.tpot.trainer = trainer

    def forget(self, pod: str) -> None:
        """Drop what was learned of `pod` alone (its speed factors): a config reload took it
        out, or put a new server under its name."""
        self.ttft.forget(pod)
        self.tpot.forget(pod)

    def set_min_samples(self, min_samples: int) -> None:
        """Observations each model needs before it predicts (a reload's new `minSamples`)."""
        self.ttft.min_samples = min_samples
        self.tpot.min_samples = min_samples

    def _weights(self) -> np.ndarray:
        """Both models' coefficients as one (features + 1) x 2 matrix, the last row the
        intercepts; rebuilt only after a training step changed either model."""
        ttft, tpot = self.ttft.fitted, self.tpot.fitted  # each one fit, read at once
        at = (ttft[3], tpot[3])
        if at != self._stacked_at:
            w = self._stacked
            w[:-1, 0], w[-1, 0] = ttft[0], ttft[1]
            w[:-1, 1], w[-1, 1] = tpot[0], tpot[1]
            self._stacked_at = at
        return self._stacked

    def _pod_factors(self, pods: Sequence[str], index: Mapping[str, int] | None) -> np.ndarray:
        """Both models' speed factors of `pods`, one row each; kept until the candidates
        change, and updated for the pods whose factor changed since (every response changes
        its pod's: reading all 1,024 again per request was a fifth of a decision)."""
        seen, ttft_at, tpot_at = self._factors_at
        ttft, tpot = self.ttft, self.tpot
        tf, pf = ttft.factors, tpot.factors
        if ttft_at == ttft.factors_version and tpot_at == tpot.factors_version and seen == pods:
            return self._factors
        changed: list[str] | None = None
        if seen == pods and index is not None and len(index) == len(pods):
            a, b = ttft.factors_changed_since(ttft_at), tpot.factors_changed_since(tpot_at)
            if a is not None and b is not None:
                changed = a + b
        if changed is None or len(changed) > len(pods):
            self._factors = np.array(
                [(tf.get(p, 1.0), pf.get(p, 1.0)) for p in pods], dtype=float
            ).reshape(-1, 2)
        else:
            factors = self._factors
            for pod in changed:
                i = index.get(pod) if index is not None else None
                if i is not None:
                    factors[i, 0] = tf.get(pod, 1.0)
                    factors[i, 1] = pf.get(pod, 1.0)
        self._factors_at = (
            pods if isinstance(pods, list) else list(pods),
            ttft.factors_version,
            tpot.factors_version,
        )
        return self._factors

    def predict(
        self, pods: Sequence[str], x: np.ndarray, index: Mapping[str, int] | None = None
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(TTFT seconds per pod or None while untrained, TPOT seconds or None), from the
        rows of `x` (one per pod, FEATURES order); `index` is pod -> position in `pods`."""
        if not self.ttft.ready:
            return None, None
        w = self._weights()
        base = x @ w[:-1]
        base += w[-1]
        np.maximum(base, MIN_PREDICTION, out=base)
        base *= self._pod_factors(pods, index)
        return base[:, 0], base[:, 1] if self.tpot.ready else None
