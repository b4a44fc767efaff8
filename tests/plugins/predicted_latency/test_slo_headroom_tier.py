"""slo-headroom-tier-filter keeps the pods predicted to meet the SLO, explores the others."""

from __future__ import annotations

from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.predicted_latency.state import PREDICTIONS_KEY
from tests.helpers import ep
from tests.plugins.helpers import req
from tests.plugins.predicted_latency.test_latency_scorer import build, preds


def test_keeps_the_positive_tier() -> None:
    f = build("slo-headroom-tier-filter", epsilonExploreNeg=0.0)
    state = CycleState({PREDICTIONS_KEY: preds(1.0, a=2.0, b=0.5, c=0.9)})
    got = f.filter(state, req(), [ep("a"), ep("b"), ep("c")])  # type: ignore[attr-defined]
    assert [e.name for e in got] == ["b", "c"]


def test_explores_the_negative_tier() -> None:
    f = build("slo-headroom-tier-filter", epsilonExploreNeg=1.0)
    state = CycleState({PREDICTIONS_KEY: preds(1.0, a=2.0, b=0.5)})
    assert [e.name for e in f.filter(state, req(), [ep("a"), ep("b")])] == ["a"]  # type: ignore[attr-defined]


def test_no_op_without_slo_or_when_one_tier_is_empty() -> None:
    f = build("slo-headroom-tier-filter", epsilonExploreNeg=0.0)
    pods = [ep("a"), ep("b")]
    for p in (preds(a=2.0, b=0.5), preds(1.0, a=2.0, b=3.0), preds(1.0)):
        assert f.filter(CycleState({PREDICTIONS_KEY: p}), req(), pods) == pods  # type: ignore[attr-defined]
