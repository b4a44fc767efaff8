"""header-label-affinity-scorer: 1 for pods whose label equals the request's header."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.header_label_affinity import (
    HeaderLabelAffinityParams,
    HeaderLabelAffinityScorer,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

SLICE = "disaggregatedset.x-k8s.io/slice"
PODS = [ep("s0", {SLICE: "0"}), ep("s1", {SLICE: "1"}), ep("none")]


def scorer() -> HeaderLabelAffinityScorer:
    p = HeaderLabelAffinityParams.model_validate(
        {"headerName": "X-Disagg-Slice", "labelKey": SLICE}
    )
    return HeaderLabelAffinityScorer("slice-affinity", p, ledger())


def scores(headers: dict[str, str]) -> dict[str, float]:
    return dict(scorer().score(CycleState(), req(headers=headers), PODS))


def test_the_pod_of_the_requested_slice_scores_one() -> None:
    assert scores({"x-disagg-slice": "1"}) == {"s0": 0.0, "s1": 1.0, "none": 0.0}


def test_missing_empty_or_unknown_header_scores_zero_everywhere() -> None:
    for headers in ({}, {"x-disagg-slice": ""}, {"x-disagg-slice": "7"}):
        assert scores(headers) == {"s0": 0.0, "s1": 0.0, "none": 0.0}


@pytest.mark.parametrize(
    "params", [{}, {"headerName": "x"}, {"labelKey": "y"}, {"headerName": "", "labelKey": "y"}]
)
def test_both_parameters_are_required(params: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        HeaderLabelAffinityParams.model_validate(params)
