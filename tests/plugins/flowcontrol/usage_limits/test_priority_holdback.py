"""priority-holdback-policy: ceilings stepped down from maxCeiling (highest active priority)
to minCeiling (lowest), by rank or by priority value, as llm-d's README gives them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.plugins.flowcontrol.usage_limits.priority_holdback import (
    PriorityHoldback,
    PriorityHoldbackParams,
)
from tests.plugins.helpers import ledger


def make(**params: Any) -> PriorityHoldback:
    return PriorityHoldback("h", PriorityHoldbackParams.model_validate(params), ledger())


def test_rank_spaces_the_ceilings_evenly_whatever_the_values() -> None:
    # c_i = max - i * (max - min) / (N - 1): 0.9, 0.65, 0.4 for three bands
    got = make(minCeiling=0.4, maxCeiling=0.9).compute_limit(0.5, [100, 2, 1])
    assert got == pytest.approx([0.9, 0.65, 0.4])


def test_value_spaces_them_by_the_priorities_gaps() -> None:
    # r = (p - pmin) / (pmax - pmin); c = min + r (max - min): 2 sits next to 1, not midway
    got = make(domain="value", minCeiling=0.5).compute_limit(0.5, [100, 2, 1])
    assert got == pytest.approx([1.0, 0.5 + 0.5 / 99, 0.5])
    # evenly spaced priorities: both domains agree
    rank = make(minCeiling=0.5).compute_limit(0.5, [100, 55, 10])
    value = make(domain="value", minCeiling=0.5).compute_limit(0.5, [100, 55, 10])
    assert rank == pytest.approx(value)


def test_one_band_or_equal_values_are_never_held_back() -> None:
    assert make(minCeiling=0.3, maxCeiling=0.9).compute_limit(0.8, [5]) == [0.9]
    assert make(domain="value", minCeiling=0.3).compute_limit(0.8, [5, 5]) == [1.0, 1.0]
    assert make(minCeiling=0.3).compute_limit(0.8, []) == []


@pytest.mark.parametrize(
    "params",
    [
        {},  # minCeiling is required
        {"minCeiling": 1.0},
        {"minCeiling": -0.1},
        {"minCeiling": 0.5, "maxCeiling": 0.0},
        {"minCeiling": 0.5, "maxCeiling": 1.1},
        {"minCeiling": 0.5, "maxCeiling": 0.5},
        {"minCeiling": 0.8, "maxCeiling": 0.5},
        {"minCeiling": 0.5, "shape": "sigmoid"},
        {"minCeiling": 0.5, "domain": "unknown"},
    ],
)
def test_llm_ds_invalid_configs_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        PriorityHoldbackParams.model_validate(params)


def test_defaults() -> None:
    p = PriorityHoldbackParams.model_validate({"minCeiling": 0.0})
    assert (p.shape, p.domain, p.max_ceiling) == ("linear", "rank", 1.0)
