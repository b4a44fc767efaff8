"""utilization-filter: load caps on the ledger's in-flight count and the pods' metrics."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import CycleState, Endpoint
from heimdall_proxy.plugins.scheduling.filters.utilization import (
    UtilizationFilter,
    UtilizationFilterParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ctx, ledger, req, sent


def make(conditions: list[dict[str, Any]], **extra: Any) -> UtilizationFilter:
    p = UtilizationFilterParams.model_validate({"conditions": conditions, **extra})
    return UtilizationFilter("u", p, ledger())


def names(flt: UtilizationFilter, pods: list[Endpoint]) -> list[str]:
    return [e.name for e in flt.filter(CycleState(), req(), pods)]


def test_the_readme_example_drops_a_pod_over_any_cap() -> None:
    flt = make(
        [
            {"metric": "running-requests", "maxValue": 40},
            {"metric": "waiting-queue", "maxValue": 0},
            {"metric": "kv-cache-utilization", "maxValue": 0.8},
        ]
    )
    pods = [
        ep("ok", running=40, waiting=0, kv_cache_usage=0.8),
        ep("busy", running=41),
        ep("queued", waiting=1),
        ep("full", kv_cache_usage=0.81),
        ep("never-scraped"),  # zero everywhere
    ]
    assert names(flt, pods) == ["ok", "never-scraped"]


def test_active_requests_are_the_ledgers_in_flight_count() -> None:
    flt = make([{"metric": "active-requests", "maxValue": 1}])
    a, b = ep("a"), ep("b")
    for i in range(2):
        sent(flt.load, ctx(req(), a, attempt=i))
    sent(flt.load, ctx(req(), b))
    assert names(flt, [a, b]) == ["b"]


def test_fallback_on_empty() -> None:
    pods = [ep("a", waiting=3), ep("b", waiting=5)]
    assert names(make([{"metric": "waiting-queue", "maxValue": 2}]), pods) == []
    flt = make([{"metric": "waiting-queue", "maxValue": 2}], fallbackOnEmpty=True)
    assert names(flt, pods) == ["a", "b"]


@pytest.mark.parametrize(
    "conditions",
    [
        [],
        [{"metric": "gpu", "maxValue": 1}],
        [{"metric": "waiting-queue"}],
        [{"metric": "waiting-queue", "maxValue": -1}],
        [{"metric": "kv-cache-utilization", "maxValue": 80}],
    ],
)
def test_invalid_conditions_are_refused(conditions: list[dict[str, Any]]) -> None:
    with pytest.raises(ValidationError):
        make(conditions)


def test_conditions_are_required() -> None:
    with pytest.raises(ValidationError):
        UtilizationFilterParams.model_validate({})
