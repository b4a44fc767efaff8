"""Scores from predictions, shared by latency-scorer and predicted-latency-scorer.

Without SLOs a pod scores (best latency / its latency) squared, in (0, 1]: the fastest pod 1,
a pod predicted twice as slow 0.25, four times as slow 1/16. Squared, because a
weighted-random picker that sent a pod predicted four times slower a quarter of the share
would put the tail of every request mix on it; load still spreads over pods predicted alike,
and as the fast pods fill up their predictions rise and the share evens out. With SLOs,
pods predicted to meet them score in [0.5, 1] and the others in [0, 0.5), so any pod that
meets the SLO outranks every one that does not."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, cast

import numpy as np

from heimdall_proxy.framework.types import AlignedScores, Endpoint
from heimdall_proxy.plugins.predicted_latency.predictor import INFLIGHT_SCALE, WAITING_SCALE
from heimdall_proxy.plugins.predicted_latency.state import (
    LatencyPredictions,
    PodPrediction,
    PodPredictions,
)

Strategy = Literal["least", "most"]


def _blend(
    p: PodPrediction, preds: LatencyPredictions, ttft_weight: float, tpot_weight: float, sign: int
) -> float:
    """Weighted mean of the headrooms (sign=1) or deficits (sign=-1) relative to each SLO,
    each clamped to [0, 1]."""
    total = weight = 0.0
    for headroom, slo, w in (
        (p.ttft_headroom, preds.ttft_slo, ttft_weight),
        (p.tpot_headroom, preds.tpot_slo, tpot_weight),
    ):
        if headroom is None or slo is None or w <= 0.0:
            continue
        total += w * min(max(sign * headroom / slo, 0.0), 1.0)
        weight += w
    return total / weight if weight > 0.0 else 0.0


def _squared(x: float) -> float:
    return x * x


def latency_scores(
    preds: LatencyPredictions,
    endpoints: Sequence[Endpoint],
    strategy: Strategy = "least",
    ttft_weight: float = 0.8,
    tpot_weight: float = 0.2,
) -> Mapping[str, float]:
    """Scores in [0, 1] by name for the endpoints that have a prediction (see module doc).
    `least` prefers the smallest positive headroom (bin-packing), `most` the largest; among
    pods missing the SLO the smallest deficit is preferred with either strategy."""
    out: dict[str, float] = {}
    if not preds.has_slo:
        pods = preds.pods
        if isinstance(pods, PodPredictions) and isinstance(endpoints, list) and endpoints:
            aligned = _latency_scores_aligned(pods, endpoints, preds.output_tokens)
            if aligned is not None:
                return aligned
        lat = {e.name: preds.latency(e.name) for e in endpoints}
        known = [v for v in lat.values() if v is not None and v > 0.0]
        if not known:
            return out
        best = min(known)
        # squared as a product (not `** 2`, which is libm's pow): the numpy pass squares the
        # same way, so both give the same floats
        return {n: _squared(best / v) for n, v in lat.items() if v is not None and v > 0.0}
    for e in endpoints:
        p = preds.pods.get(e.name)
        if p is None:
            continue
        if p.meets_slo:
            h = _blend(p, preds, ttft_weight, tpot_weight, 1)
            out[e.name] = 0.5 + 0.5 * (1.0 - h if strategy == "least" else h)
        else:
            d = _blend(p, preds, ttft_weight, tpot_weight, -1)
            out[e.name] = 0.49 * (1.0 - d)
    return out


def _latency_scores_aligned(
    pods: PodPredictions, endpoints: list[Endpoint], output_tokens: int
) -> AlignedScores | None:
    """latency_scores without SLOs from the prediction arrays, in one numpy pass: the same
    arithmetic as pod by pod. None when a candidate has no prediction or no positive latency
    (the pod-by-pod rule leaves such pods out)."""
    if endpoints is pods.endpoints:  # no filter narrowed them: every row, in order
        lat = pods.ttft
        if pods.tpot is not None:
            lat = lat + pods.tpot * output_tokens
    else:
        found = list(map(pods.index.get, [e.name for e in endpoints]))
        if None in found:
            return None
        picked = cast(list[int], found)
        lat = pods.ttft[picked]
        if pods.tpot is not None:
            lat = lat + pods.tpot[picked] * output_tokens
    if not bool(np.all(lat > 0.0)):
        return None
    best = float(lat.min())
    ratio = best / lat
    return AlignedScores(endpoints, ratio * ratio)  # the scheduler adds the array as one


def composite_scores(
    endpoints: Sequence[Endpoint],
    prefix_ratio: dict[str, float],
    kv_weight: float = 1.0,
    queue_weight: float = 1.0,
    prefix_weight: float = 1.0,
    inflight: dict[str, int] | None = None,
    preds: LatencyPredictions | None = None,
) -> Mapping[str, float]:
    """The fallback without predictions: a weighted mean of free KV cache, a short queue
    (relative to the longest among the candidates) and the prefix-cache match. The queue is
    the scraped one plus what this gateway has in flight there (`inflight`), which a scrape
    shows late and which grows on a slow pod before its queue does.

    With `preds` (whose `inflight` and `prefix` these are) the scraped queue, KV use and
    in-flight count are read from its feature rows, one numpy pass over the candidates: the
    same numbers (the rows hold them scaled by powers of two, exactly) and the same
    arithmetic, in the same order, as pod by pod."""
    total = kv_weight + queue_weight + prefix_weight
    if total <= 0.0:
        return {e.name: 0.0 for e in endpoints}
    if preds is not None and preds.rows is not None and len(endpoints):
        names = [e.name for e in endpoints]
        found = list(map(preds.row_index.get, names))
        if None not in found:  # every one was predicted for: its row holds its load
            picked = cast(list[int], found)
            return _composite_rows(
                list(endpoints),
                preds,
                picked,
                prefix_ratio,
                (kv_weight, queue_weight, prefix_weight),
            )
    inflight = inflight or {}
    queues = {e.name: e.metrics.waiting + inflight.get(e.name, 0) for e in endpoints}
    longest = max(queues.values(), default=0)
    out: dict[str, float] = {}
    for e in endpoints:
        queue = 1.0 - queues[e.name] / longest if longest > 0 else 1.0
        kv = 1.0 - min(max(e.metrics.kv_cache_usage, 0.0), 1.0)
        prefix = prefix_ratio.get(e.name, 0.0)
        out[e.name] = (kv_weight * kv + queue_weight * queue + prefix_weight * prefix) / total
    return out


def _composite_rows(
    endpoints: list[Endpoint],
    preds: LatencyPredictions,
    picked: list[int],
    prefix_ratio: dict[str, float],
    weights: tuple[float, float, float],
) -> AlignedScores:
    """composite_scores of `endpoints`, whose rows of `preds.rows` are `picked`."""
    full = preds.rows
    assert full is not None
    rows = full
    kv_weight, queue_weight, prefix_weight = weights
    total = kv_weight + queue_weight + prefix_weight
    whole = len(picked) == len(rows) and picked == list(range(len(rows)))
    if not whole:
        rows = rows[picked]
    queues = rows[:, 0] * WAITING_SCALE + rows[:, 5] * INFLIGHT_SCALE
    longest = float(queues.max())
    queue = 1.0 - queues / longest if longest > 0 else np.ones(len(endpoints))
    kv = 1.0 - np.minimum(np.maximum(rows[:, 2], 0.0), 1.0)
    prefix = np.zeros(len(full))
    for pod, r in prefix_ratio.items():  # the pods with a match: few
        i = preds.row_index.get(pod)
        if i is not None:
            prefix[i] = r
    if not whole:
        prefix = prefix[picked]
    out = (kv_weight * kv + queue_weight * queue + prefix_weight * prefix) / total
    return AlignedScores(endpoints, out.tolist())
