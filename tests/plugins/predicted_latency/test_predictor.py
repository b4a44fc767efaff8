"""LatencyPredictor and FeatureMatrix: the column-wise feature matrix equals the row-wise
definition, follows a new scrape, and predictions follow every change of a pod's learned
speed factor (the cached arrays are invalidated, never stale)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from heimdall_proxy.plugins.predicted_latency.predictor import (
    FeatureMatrix,
    LatencyPredictor,
    features,
)
from tests.helpers import ep


def test_matrix_equals_the_rows_and_follows_a_new_scrape() -> None:
    pods = [ep("a", waiting=3, running=10, kv_cache_usage=0.4), ep("b", waiting=0, running=2)]
    fm = FeatureMatrix()
    x = fm.build(pods, 500, [500, 100], [2, 0], [800.0, 0.0], 64)
    want = [features(pods[0], 500, 500, 2, 800.0, 64), features(pods[1], 500, 100, 0, 0.0, 64)]
    assert np.allclose(x, want)
    pods[1].metrics = replace(pods[1].metrics, waiting=7)  # a scrape replaces the snapshot
    x = fm.build(pods, 500, None, [2, 0], [800.0, 0.0], 64)
    assert x[1, 0] == pytest.approx(7 / 8) and x[1, 4] == pytest.approx(0.5)


def test_predictions_follow_factor_changes() -> None:
    rng = random.Random(3)
    predictor = LatencyPredictor(min_samples=8, batch_size=8)
    pods = [ep("a"), ep("b")]
    x = FeatureMatrix().build(pods, 400, None, [0, 0], [0.0, 0.0], 32)
    for _ in range(64):
        row = [rng.random() for _ in range(8)]
        predictor.ttft.observe("a", row, 0.1 + 0.1 * sum(row))
        predictor.tpot.observe("a", row, 0.01 + 0.01 * sum(row))
    ttft, tpot = predictor.predict(["a", "b"], x)
    assert ttft is not None and tpot is not None
    before = ttft.copy()
    predictor.ttft.raise_factor("b", elapsed=50.0, base=float(ttft[1]) / 1.0)
    ttft, _ = predictor.predict(["a", "b"], x)
    assert ttft is not None
    assert ttft[0] == pytest.approx(before[0]) and ttft[1] > 10 * before[1]
    # the candidates in another order: rows and factors follow the names
    ttft2, _ = predictor.predict(["b", "a"], np.ascontiguousarray(x[::-1]))
    assert ttft2 is not None and ttft2.tolist() == pytest.approx(ttft[::-1].tolist())


def test_matrix_kept_across_scrapes_equals_one_built_afresh() -> None:
    """Updated row by row (a few pods scraped) or rebuilt (most of them), the kept scraped
    columns are always those a new FeatureMatrix reads."""
    rng = random.Random(38)
    pods = [ep(f"p{i}", waiting=i % 5, running=i % 17, kv_cache_usage=i / 300) for i in range(300)]
    kept = FeatureMatrix()
    for _ in range(60):
        share = rng.choice([0.0, 0.01, 0.1, 0.5, 1.0])
        for e in pods:
            if rng.random() < share:
                e.metrics = replace(
                    e.metrics,
                    waiting=rng.randrange(0, 9),
                    running=rng.randrange(0, 40),
                    kv_cache_usage=rng.random(),
                )
        cands = pods if rng.random() < 0.8 else pods[: rng.randrange(1, 300)]
        counts = [rng.randrange(0, 3) for _ in cands]
        args = (500, None, counts, [100.0 * c for c in counts], 64)
        got = kept.build(cands, *args)
        want = FeatureMatrix().build(cands, *args)
        assert np.array_equal(got, want)


def test_rows_kept_by_the_scrapes_themselves_equal_a_fresh_reading() -> None:
    """While the candidates are the same list, the rows are kept current by the writer as
    it replaces snapshots (nothing is read per request): after random scrapes (a few pods,
    all of them, one pod several times, an old snapshot put back) they are the rows a new
    FeatureMatrix reads; and so after the candidates change (a narrower list, a pod twice)."""
    rng = random.Random(3800)
    pods = [ep(f"p{i}", waiting=i % 5, running=i % 17, kv_cache_usage=i / 300) for i in range(200)]
    kept = FeatureMatrix()
    old = [e.metrics for e in pods]
    cands: list = pods
    for step in range(80):
        for _ in range(rng.choice([0, 1, 3, 50, 400])):
            e = rng.choice(pods)
            if rng.random() < 0.1:
                e.metrics = rng.choice(old)  # an earlier snapshot object, assigned again
            else:
                e.metrics = replace(
                    e.metrics, waiting=rng.randrange(0, 9), kv_cache_usage=rng.random()
                )
        if step % 10 == 9:
            cands = rng.choice([pods, pods[: rng.randrange(1, 200)], pods[:5] + pods[:5]])
        counts = [0] * len(cands)
        args = (500, None, counts, [0.0] * len(cands), 64)
        assert np.array_equal(kept.build(cands, *args), FeatureMatrix().build(cands, *args))


def test_speed_factors_kept_by_change_equal_a_reading_of_every_pod() -> None:
    """The factors the predictor keeps for the candidates, updated for the pods whose factor
    changed, equal every pod's factor read afresh, after random observations, censored raises
    and forgotten pods (and past the changes the model remembers)."""
    rng = random.Random(38)
    predictor = LatencyPredictor(min_samples=1, batch_size=1)
    names = [f"p{i}" for i in range(120)]
    index = {n: i for i, n in enumerate(names)}
    row = [0.1] * 8
    for model in (predictor.ttft, predictor.tpot):
        model.observe("p0", row, 0.5)  # trained (ready): observations now move factors
        model.batch_size = 10**9  # and train no further: only the factors are under test
    for step in range(300):
        for _ in range(rng.choice([0, 1, 5, 50, 3000])):
            pod = rng.choice(names)
            what = rng.random()
            if what < 0.5:
                predictor.ttft.observe(pod, row, rng.uniform(0.05, 2.0))
                predictor.tpot.observe(pod, row, rng.uniform(0.001, 0.05))
            elif what < 0.9:
                predictor.ttft.raise_factor(pod, rng.uniform(0.0, 5.0), 0.1)
            else:
                predictor.ttft.forget(pod)
        got = predictor._pod_factors(names, index)
        tf, pf = predictor.ttft.factors, predictor.tpot.factors
        want = np.array([(tf.get(p, 1.0), pf.get(p, 1.0)) for p in names])
        assert np.array_equal(got, want), step
    assert predictor.ttft.factors_changed_since(-1) is None
    predictor.ttft.forget("p0")
    version = predictor.ttft.factors_version
    predictor.ttft.raise_factor("p0", 1e9, 1.0)
    assert predictor.ttft.factors_changed_since(version) == ["p0"]
