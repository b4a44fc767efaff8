"""static-usage-limit-policy: one ceiling for every band, llm-d's default at 1.0."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from heimdall_proxy.plugins.flowcontrol.usage_limits.static import (
    StaticUsageLimit,
    StaticUsageLimitParams,
)
from tests.plugins.helpers import ledger


def make(**params: float) -> StaticUsageLimit:
    return StaticUsageLimit("s", StaticUsageLimitParams.model_validate(params), ledger())


def test_the_default_is_no_gating_below_saturation() -> None:
    assert make().compute_limit(0.99, [10, 0, -1]) == [1.0, 1.0, 1.0]


def test_a_threshold_reserves_headroom_for_every_priority() -> None:
    assert make(threshold=0.8).compute_limit(0.5, [10, 0]) == [0.8, 0.8]
    assert make(threshold=0.8).compute_limit(0.5, []) == []


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5])
def test_the_threshold_is_in_0_1(bad: float) -> None:
    with pytest.raises(ValidationError):
        StaticUsageLimitParams.model_validate({"threshold": bad})
