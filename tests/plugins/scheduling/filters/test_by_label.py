"""by-label filter."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.scheduling.filters.by_label import (
    BY_LABEL_TYPE,
    ByLabelFilter,
    ByLabelParams,
)
from tests.helpers import ep


def req() -> InferenceRequest:
    return InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})


def make(**params: Any) -> ByLabelFilter:
    handle = PluginHandle(pool=None)  # type: ignore[arg-type]
    return ByLabelFilter("f", ByLabelParams.model_validate(params), handle)


PODS = [
    ep("decode", {"role": "decode"}),
    ep("prefill", {"role": "prefill"}),
    ep("both", {"role": "both"}),
    ep("none"),
    ep("other", {"zone": "x"}),
]


def names(endpoints: list[Endpoint]) -> list[str]:
    return [e.name for e in endpoints]


def test_type_name() -> None:
    assert BY_LABEL_TYPE == "by-label"
    assert make(label="role", validValues=["decode"]).type == "by-label"


def test_keeps_pods_with_a_valid_value_in_order() -> None:
    flt = make(label="role", validValues=["both", "decode"])
    assert names(flt.filter(CycleState(), req(), PODS)) == ["decode", "both"]


def test_missing_label_rejected_by_default() -> None:
    flt = make(label="role", validValues=["prefill"])
    assert names(flt.filter(CycleState(), req(), PODS)) == ["prefill"]


def test_allows_no_label_keeps_unlabelled_pods() -> None:
    flt = make(label="role", validValues=["prefill"], allowsNoLabel=True)
    assert names(flt.filter(CycleState(), req(), PODS)) == ["prefill", "none", "other"]


def test_allows_no_label_without_valid_values() -> None:
    flt = make(label="role", allowsNoLabel=True)
    assert names(flt.filter(CycleState(), req(), PODS)) == ["none", "other"]


def test_empty_label_value_is_a_value_not_absence() -> None:
    pods = [ep("empty", {"role": ""}), ep("none")]
    assert names(make(label="role", validValues=[""]).filter(CycleState(), req(), pods)) == [
        "empty"
    ]
    allow = make(label="role", validValues=["x"], allowsNoLabel=True)
    assert names(allow.filter(CycleState(), req(), pods)) == ["none"]


def test_nothing_matches() -> None:
    flt = make(label="role", validValues=["encode"])
    assert flt.filter(CycleState(), req(), PODS) == []
    assert flt.filter(CycleState(), req(), []) == []


def test_returns_the_same_objects() -> None:
    flt = make(label="role", validValues=["decode"])
    [kept] = flt.filter(CycleState(), req(), PODS)
    assert kept is PODS[0]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"label": "role"}, "validValues is required unless allowsNoLabel is true"),
        ({"label": "role", "validValues": []}, "validValues is required"),
        ({"label": "", "validValues": ["a"]}, "label must not be empty"),
        ({"validValues": ["a"]}, "Field required"),
        ({"label": "role", "validValues": "decode"}, "valid list"),
    ],
)
def test_invalid_params(params: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        ByLabelParams.model_validate(params)
