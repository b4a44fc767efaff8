"""soft-reflective-ceiling-policy: the reflective ceiling 1 - i * s / (N - 1) per band, and the
shared open/closed alternation of the bands past it, on llm-d's documented examples."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from heimdall_proxy.plugins.flowcontrol.usage_limits.soft_reflective_ceiling import (
    SoftReflectiveCeiling,
    SoftReflectiveCeilingParams,
)
from tests.plugins.helpers import ledger


def make() -> SoftReflectiveCeiling:
    return SoftReflectiveCeiling("sr", SoftReflectiveCeilingParams(), ledger())


def test_the_highest_band_is_never_gated_and_one_band_is_always_open() -> None:
    p = make()
    for s in (0.0, 0.3, 0.5, 0.7, 0.99, 1.0, 1.5):
        assert p.compute_limit(s, [100, 0, -50])[0] == 1.0
        assert p.compute_limit(s, [100]) == [1.0]
    assert p.compute_limit(0.9, []) == []


def test_below_every_reflective_ceiling_all_bands_are_open() -> None:
    assert make().compute_limit(0.3, [100, 0, -50]) == [1.0, 1.0, 1.0]


def test_at_full_saturation_all_but_the_highest_are_held() -> None:
    assert make().compute_limit(1.0, [100, 0, -50]) == [1.0, 0.0, 0.0]


def test_the_reflection_gates_the_lower_bands_first() -> None:
    # at 0.7 over four bands the ceilings are 1, 0.767, 0.533, 0.3: band 1 stays open,
    # bands 2 and 3 are past theirs and alternate together
    p = make()
    for _ in range(6):
        got = p.compute_limit(0.7, [100, 50, 0, -50])
        assert got[:2] == [1.0, 1.0]
        assert got[2] == got[3] and got[2] in (0.0, 1.0)


@pytest.mark.parametrize(
    ("saturation", "pattern"),
    [
        (0.7, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]),  # period round(0.7 / 0.3) = 2
        (0.75, [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]),  # period 3
    ],
)
def test_a_gated_band_opens_once_a_period(saturation: float, pattern: list[float]) -> None:
    p = make()
    assert [p.compute_limit(saturation, [100, -50])[1] for _ in pattern] == pattern


def test_gated_bands_open_on_the_same_decisions_so_none_starves() -> None:
    p = make()
    for _ in range(3):
        p.compute_limit(0.6, [100, 0, -50])
    opened = [p.compute_limit(0.7, [100, 0, -50]) for _ in range(100)]
    assert all(c[1] == c[2] for c in opened)
    assert 0 < sum(c[2] for c in opened) < 100


def test_it_takes_no_parameters() -> None:
    with pytest.raises(ValidationError):
        SoftReflectiveCeilingParams.model_validate({"threshold": 0.5})
    SoftReflectiveCeilingParams.model_validate({})
