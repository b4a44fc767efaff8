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
