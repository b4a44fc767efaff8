"""latency-scorer and predicted-latency-scorer on hand-made predictions, the producer's
predictions once trained, and the extension points each latency plugin serves."""

from __future__ import annotations

import logging

import pytest

from heimdall_proxy.config.build import instantiate
from heimdall_proxy.config.gateway import PluginConfig
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.plugins import extension_points
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.predicted_latency.state import (
    PREDICTIONS_KEY,
    LatencyPredictions,
    PodPrediction,
)
from tests.helpers import ep
from tests.plugins.helpers import req


def build(kind: str, **params: object) -> object:
    handle = PluginHandle(pool=None)  # type: ignore[arg-type]
    return instantiate(load_builtin_plugins(), PluginConfig(type=kind, parameters=params), handle)


def preds(ttft_slo: float | None = None, **ttft: float) -> LatencyPredictions:
    out = LatencyPredictions(ttft_slo=ttft_slo, tpot_slo=None, output_tokens=10)
    for name, t in ttft.items():
        out.pods[name] = PodPrediction(
            t, None, ttft_slo - t if ttft_slo is not None else None, None, 0.0, 1
        )
        out.prefix[name] = 0.0
    return out


@pytest.mark.parametrize(
    ("kind", "points"),
    [
        (
            "predicted-latency-producer",
            ["Producer", "PreRequest", "ResponseStreaming", "ResponseComplete"],
        ),
        ("latency-scorer", ["Scorer"]),
        (
            "predicted-latency-scorer",
            ["Scorer", "Producer", "PreRequest", "ResponseStreaming", "ResponseComplete"],
        ),
        ("slo-headroom-tier-filter", ["Filter"]),
        ("latency-slo-admitter", ["Admitter"]),
        (
            "prefix-cache-affinity-filter",
            ["Filter", "PreRequest", "ResponseStreaming", "ResponseComplete"],
        ),
    ],
)
def test_extension_points(kind: str, points: list[str]) -> None:
    assert extension_points(build(kind)) == points


def test_without_slo_the_fastest_pod_scores_one_and_others_by_squared_ratio() -> None:
    state = CycleState({PREDICTIONS_KEY: preds(a=0.1, b=0.4)})
    scores = build("latency-scorer").score(state, req(), [ep("a"), ep("b")])  # type: ignore[attr-defined]
    assert scores == pytest.approx({"a": 1.0, "b": 0.0625})  # (0.1 / 0.4) squared


@pytest.mark.parametrize(("strategy", "best"), [("least", "b"), ("most", "a")])
def test_headroom_strategy(strategy: str, best: str) -> None:
    # SLO 1 s: a has 0.9 s headroom, b 0.2 s, c misses it
    state = CycleState({PREDICTIONS_KEY: preds(1.0, a=0.1, b=0.8, c=1.5)})
    scorer = build("latency-scorer", headroomSelectionStrategy=strategy)
    scores = scorer.score(state, req(), [ep("a"), ep("b"), ep("c")])  # type: ignore[attr-defined]
    assert max(scores, key=lambda n: scores[n]) == best
    assert scores["c"] < 0.5 <= min(scores["a"], scores["b"])


def test_composite_fallback_without_predictions() -> None:
    state = CycleState({PREDICTIONS_KEY: preds()})
    pods = [ep("busy", waiting=4, kv_cache_usage=0.9), ep("idle", waiting=0, kv_cache_usage=0.1)]
    scores = build("latency-scorer").score(state, req(), pods)  # type: ignore[attr-defined]
    assert scores["idle"] > scores["busy"]


def test_bad_strategy_is_a_config_error() -> None:
    with pytest.raises(Exception, match="headroomSelectionStrategy"):
        build("latency-scorer", headroomSelectionStrategy="random")


def test_predicted_latency_scorer_has_the_reference_defaults() -> None:
    p = build("predicted-latency-scorer").params  # type: ignore[attr-defined]
    assert (p.sampling_mean, p.max_sampled_tokens, p.slo_buffer_factor) == (1000.0, 5, 1.0)
    assert (p.neg_headroom_ttft_weight, p.neg_headroom_tpot_weight) == (0.8, 0.2)
    assert (p.headroom_ttft_weight, p.headroom_tpot_weight) == (0.8, 0.2)
    assert p.headroom_selection_strategy == "least" and p.selection_mode == "linear"
    assert (p.epsilon_explore_sticky, p.epsilon_explore_neg) == (0.01, 0.01)
    assert (p.affinity_gate_tau, p.affinity_gate_tau_global) == (0.8, 0.99)
    assert p.request_timeout == 300.0 and p.streaming_mode is True


def test_predicted_latency_scorer_honours_sampling_mean(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        scorer = build("predicted-latency-scorer", samplingMean=10)
    assert scorer._sampler.mean == 10.0  # type: ignore[attr-defined]
    assert "samplingMean" not in caplog.text


def test_predicted_latency_scorer_picks_a_pod_meeting_the_slo() -> None:
    scorer = build("predicted-latency-scorer", epsilonExploreNeg=0.0)
    state = CycleState({PREDICTIONS_KEY: preds(1.0, a=2.0, b=0.5, c=3.0)})
    for _ in range(20):
        assert scorer.score(state, req(), [ep("a"), ep("b"), ep("c")]) == {"b": 1.0}  # type: ignore[attr-defined]


def test_composite_fallback_counts_the_gateways_in_flight_requests() -> None:
    """Before the model is trained a slow pod shows up as requests that do not finish."""
    p = preds()
    p.inflight = {"slow": 6, "fast": 1}
    state = CycleState({PREDICTIONS_KEY: p})
    scores = build("latency-scorer").score(state, req(), [ep("slow"), ep("fast")])  # type: ignore[attr-defined]
    assert scores["fast"] > scores["slow"]


def test_predicted_latency_scorer_takes_tpot_samples_from_max_sampled_tokens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        scorer = build("predicted-latency-scorer", maxSampledTokens=3, maxTPOTSamples=9)
    assert scorer._max_tpot_samples == 3  # type: ignore[attr-defined]
    assert "maxTPOTSamples" in caplog.text


def test_predicted_latency_scorer_selection_mode_max_takes_the_heaviest_pod() -> None:
    """Without SLOs, a pod predicted 1.5x slower keeps 0.44 of the weight: `linear` sends
    it some requests, `max` never does."""
    state = CycleState({PREDICTIONS_KEY: preds(a=0.3, b=0.2)})
    pods = [ep("a"), ep("b")]
    for mode, want_a in (("max", False), ("linear", True)):
        scorer = build("predicted-latency-scorer", selectionMode=mode)
        chosen = {next(iter(scorer.score(state, req(), pods))) for _ in range(200)}  # type: ignore[attr-defined]
        assert ("a" in chosen) is want_a and "b" in chosen


def test_predicted_latency_scorer_refuses_an_unknown_selection_mode() -> None:
    with pytest.raises(Exception, match="selectionMode"):
        build("predicted-latency-scorer", selectionMode="softmax")


@pytest.mark.parametrize(
    ("strategy", "slo", "want"),
    [
        ("least", None, "busy"),  # without SLOs: the lowest predicted latency
        ("composite-only", None, "idle"),  # the composite alone: free KV cache, short queue
        ("composite-most", 1.0, "idle"),
        ("composite-least", 1.0, "busy"),  # the positive tier's composite, inverted
    ],
)
def test_predicted_latency_scorer_composite_strategies(
    strategy: str, slo: float | None, want: str
) -> None:
    # busy is predicted faster (0.1 s against 0.5 s) but has the longer queue and fuller cache
    state = CycleState({PREDICTIONS_KEY: preds(slo, busy=0.1, idle=0.5)})
    pods = [ep("busy", waiting=4, kv_cache_usage=0.9), ep("idle", waiting=0, kv_cache_usage=0.1)]
    scorer = build(
        "predicted-latency-scorer",
        headroomSelectionStrategy=strategy,
        selectionMode="max",
        epsilonExploreNeg=0.0,
    )
    assert scorer.score(state, req(), pods) == {want: 1.0}  # type: ignore[attr-defined]
