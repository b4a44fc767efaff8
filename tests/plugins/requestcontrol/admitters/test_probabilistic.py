"""probabilistic-admitter: the shedding curve min(load ** power * k, 1) over the candidates'
mean load, on llm-d's documented points; only sheddable requests are ever refused."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.requestcontrol.admitters.probabilistic import (
    ProbabilisticAdmitter,
    ProbabilisticAdmitterParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req


def make(draw: float = 0.5, **params: Any) -> ProbabilisticAdmitter:
    return ProbabilisticAdmitter(
        "pa", ProbabilisticAdmitterParams.model_validate(params), ledger(), rand=lambda: draw
    )


def pod(name: str = "p", waiting: int = 0, kv: float = 0.0) -> Endpoint:
    return ep(name, waiting=waiting, kv_cache_usage=kv, updated_at=time.monotonic())


def sheddable(priority: int = -1) -> InferenceRequest:
    r = req()
    r.priority = priority
    return r


def admit(a: ProbabilisticAdmitter, r: InferenceRequest, pods: list[Endpoint]) -> str | None:
    return a.admit_request(CycleState(), r, pods)


def test_defaults() -> None:
    p = ProbabilisticAdmitterParams()
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold, p.power, p.k) == (5, 0.8, 5, 300)


@pytest.mark.parametrize(
    "params",
    [{"queueDepthThreshold": 0}, {"kvCacheUtilThreshold": 0}, {"power": 0}, {"k": -1}],
)
def test_thresholds_and_curve_must_be_positive(params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ProbabilisticAdmitterParams.model_validate(params)


@pytest.mark.parametrize(
    ("load", "chance"),
    [(0.08, 0.0001), (0.15, 0.023), (0.20, 0.096), (0.30, 0.729), (0.34, 1.0), (1.0, 1.0)],
)
def test_the_documented_curve(load: float, chance: float) -> None:
    assert make().shed_probability(load) == pytest.approx(chance, abs=0.001)


def test_the_load_is_the_mean_of_each_pods_worse_ratio() -> None:
    a = make()
    # max(2/5, 0.4/0.8) = 0.5 and max(4/5, 0.2/0.8) = 0.8: mean 0.65
    assert a.load([pod("a", 2, 0.4), pod("b", 4, 0.2)]) == pytest.approx(0.65)
    # a pod never scraped counts as full
    assert a.load([pod("a"), ep("new")]) == pytest.approx(0.5)


def test_critical_and_standard_requests_are_always_admitted() -> None:
    a = make(draw=0.0)
    full = [pod(waiting=100)]
    assert admit(a, sheddable(0), full) is None
    assert admit(a, sheddable(5), full) is None
    assert admit(a, sheddable(-1), []) is None  # no pods: nothing to judge


def test_a_sheddable_request_is_refused_with_the_curves_probability() -> None:
    # KV 0.16 / 0.8 = load 0.2: refused with probability 0.2 ** 5 * 300 = 0.096
    pods = [pod(kv=0.16)]
    assert admit(make(draw=0.9), sheddable(), pods) is None
    refusal = admit(make(draw=0.0), sheddable(), pods)
    assert refusal is not None and "0.200" in refusal and "0.10" in refusal
    # KV 0.272 / 0.8 = 0.34: certain refusal, whatever the draw
    assert admit(make(draw=0.999), sheddable(), [pod(kv=0.272)]) is not None
    # idle: never
    assert admit(make(draw=0.0), sheddable(), [pod()]) is None


def test_its_thresholds_set_where_a_pod_counts_full() -> None:
    a = make(draw=0.999, queueDepthThreshold=100, kvCacheUtilThreshold=1.0)
    assert admit(a, sheddable(), [pod(waiting=20, kv=0.2)]) is None  # load 0.2 < 0.34
