"""The prediction arrays and the scores read from them in one numpy pass equal the
pod-by-pod definitions exactly: PodPredictions against a PodPrediction per pod,
latency_scores without SLOs and the composite fallback against their per-pod paths, for every
candidate or a filtered subset."""

from __future__ import annotations

import random

import numpy as np

from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.plugins.predicted_latency.predictor import FeatureMatrix
from heimdall_proxy.plugins.predicted_latency.selection import composite_scores, latency_scores
from heimdall_proxy.plugins.predicted_latency.state import (
    LatencyPredictions,
    PodPrediction,
    PodPredictions,
)
from tests.helpers import ep


def _case(
    rng: random.Random, n: int
) -> tuple[list[Endpoint], LatencyPredictions, LatencyPredictions]:
    """Candidates and the same predictions twice: as arrays, and as a dict of PodPrediction
    (the per-pod path)."""
    pods = [
        ep(f"p{i}", waiting=rng.randrange(0, 6), kv_cache_usage=rng.choice([0.0, rng.random()]))
        for i in range(n)
    ]
    slo = rng.choice([None, 0.5])
    arrays = LatencyPredictions(ttft_slo=slo, tpot_slo=None, output_tokens=rng.choice([1, 64]))
    arrays.inflight = {e.name: rng.randrange(1, 4) for e in pods if rng.random() < 0.2}
    arrays.prefix = {e.name: rng.random() for e in pods if rng.random() < 0.1}
    counts = [arrays.inflight.get(e.name, 0) for e in pods]
    arrays.rows = FeatureMatrix().build(pods, 300, None, counts, [0.0] * n, 64)
    names = [e.name for e in pods]
    arrays.row_index = {name: i for i, name in enumerate(names)}
    ttft = np.array([rng.uniform(0.01, 2.0) for _ in pods])
    tpot = np.array([rng.uniform(0.001, 0.05) for _ in pods]) if rng.random() < 0.5 else None
    arrays.pods = PodPredictions(pods, names, arrays.row_index, ttft, tpot, arrays)
    per_pod = LatencyPredictions(
        ttft_slo=slo,
        tpot_slo=None,
        output_tokens=arrays.output_tokens,
        pods={name: arrays.pods[name] for name in names},
        prefix=arrays.prefix,
        inflight=arrays.inflight,
    )
    return pods, arrays, per_pod


def test_arrays_read_as_the_per_pod_definitions() -> None:
    rng = random.Random(38)
    for trial in range(150):
        pods, arrays, per_pod = _case(rng, rng.choice([1, 3, 50, 400]))
        for i, e in enumerate(pods):  # one pod's prediction, as the producer made them
            t = float(arrays.pods.ttft[i])  # type: ignore[attr-defined]
            tpots = arrays.pods.tpot  # type: ignore[attr-defined]
            tp = float(tpots[i]) if tpots is not None else None
            slo = arrays.ttft_slo
            assert arrays.pods[e.name] == PodPrediction(
                t,
                tp,
                slo - t if slo is not None else None,
                None,
                arrays.prefix.get(e.name, 0.0),
                arrays.inflight.get(e.name, 0),
            )
        for cands in (pods, [e for e in pods if rng.random() < 0.5] or pods[:1]):
            got = latency_scores(arrays, cands)
            assert dict(got) == dict(latency_scores(per_pod, cands)), trial
            got = composite_scores(cands, arrays.prefix, 1.0, 2.0, 0.5, arrays.inflight, arrays)
            want = composite_scores(cands, arrays.prefix, 1.0, 2.0, 0.5, arrays.inflight)
            assert dict(got) == want, trial
