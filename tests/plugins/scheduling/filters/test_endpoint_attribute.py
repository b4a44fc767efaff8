"""endpoint-attribute-filter: a numeric attribute on the Endpoint against a threshold, with
the attributes set on the pods directly (as any extractor publishes them)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.attributes import data_key
from heimdall_proxy.framework.types import CycleState, Endpoint
from heimdall_proxy.plugins.scheduling.filters.endpoint_attribute import (
    EndpointAttributeFilter,
    EndpointAttributeFilterParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

GPU = data_key("GPUUtilization", "dcgm-extractor")


def pod(name: str, **attrs: object) -> Endpoint:
    e = ep(name)
    e.attributes.update(attrs)
    return e


def make(**params: Any) -> EndpointAttributeFilter:
    base: dict[str, Any] = {
        "attribute": "GPUUtilization",
        "producer": "dcgm-extractor",
        "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 0.8}},
    }
    base.update(params)
    p = EndpointAttributeFilterParams.model_validate(base)
    return EndpointAttributeFilter("f", p, ledger())


def names(flt: EndpointAttributeFilter, pods: list[Endpoint]) -> list[str]:
    return [e.name for e in flt.filter(CycleState(), req(), pods)]


PODS = [
    pod("cool", **{GPU: 0.2}),
    pod("hot", **{GPU: 0.95}),
    pod("edge", **{GPU: 0.8}),
    pod("bare"),
]


def test_threshold_keeps_the_pods_that_compare_true_and_missing_pass_by_default() -> None:
    assert names(make(), PODS) == ["cool", "bare"]


@pytest.mark.parametrize(
    ("op", "kept"),
    [
        ("LessThan", ["cool"]),
        ("LessThanOrEqual", ["cool", "edge"]),
        ("GreaterThan", ["hot"]),
        ("GreaterThanOrEqual", ["hot", "edge"]),
        ("Equal", ["edge"]),
        ("NotEqual", ["cool", "hot"]),
    ],
)
def test_every_operator(op: str, kept: list[str]) -> None:
    algo = {"type": "threshold", "threshold": {"operator": op, "value": 0.8}}
    assert names(make(algorithm=algo, onMissing="Fail"), PODS) == kept


def test_on_missing_fail_drops_pods_without_the_attribute_and_non_numbers() -> None:
    odd = pod("odd", **{GPU: "high"})
    flag = pod("flag", **{GPU: True})
    assert names(make(onMissing="Fail"), [*PODS, odd, flag]) == ["cool"]
    assert names(make(onMissing=""), [odd]) == ["odd"]  # "" is llm-d's Pass


def test_fallback_on_empty_returns_every_candidate() -> None:
    hot = [PODS[1], PODS[2]]
    assert names(make(), hot) == []
    assert names(make(fallbackOnEmpty=True), hot) == ["hot", "edge"]


def test_producer_names_the_key_read() -> None:
    mine = pod("mine", **{data_key("GPUUtilization", "my-dcgm"): 0.1})
    assert names(make(onMissing="Fail"), [mine]) == []
    assert names(make(onMissing="Fail", producer="my-dcgm"), [mine]) == ["mine"]
    agnostic = pod("a", **{data_key("llm-d.ai/queue", ""): 0})
    flt = make(attribute="llm-d.ai/queue", producer="", onMissing="Fail")
    assert names(flt, [agnostic]) == ["a"]


def test_no_producer_reads_core_metrics_extractor_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        flt = make(producer=None, attribute="num_requests_running")
    assert flt.key == "num_requests_running/core-metrics-extractor"
    assert "core-metrics-extractor" in caplog.text and "does not have" in caplog.text


@pytest.mark.parametrize(
    "bad",
    [
        {"attribute": ""},
        {"attribute": "GPUUtilization/dcgm-extractor", "producer": None},  # old spelling
        {"onMissing": "Maybe"},
        {"algorithm": {"type": "percentile"}},
        {"algorithm": {"type": "threshold"}},
        {"algorithm": {"type": "threshold", "threshold": {"operator": "Less", "value": 1}}},
    ],
)
def test_invalid_parameters_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        make(**bad)
