"""endpoint-attribute-filter: a numeric attribute on the Endpoint against a threshold, with
the attributes set on the pods directly (as any extractor publishes them)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import CycleState, Endpoint
from heimdall_proxy.plugins.scheduling.filters.endpoint_attribute import (
    EndpointAttributeFilter,
    EndpointAttributeFilterParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

GPU = ("GPUUtilization", "dcgm-extractor")


def pod(name: str, attrs: dict[tuple[str, str], object] | None = None) -> Endpoint:
    e = ep(name)
    e.attributes.update(attrs or {})
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
    pod("cool", {GPU: 0.2}),
    pod("hot", {GPU: 0.95}),
    pod("edge", {GPU: 0.8}),
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
    odd = pod("odd", {GPU: "high"})
    flag = pod("flag", {GPU: True})
    assert names(make(onMissing="Fail"), [*PODS, odd, flag]) == ["cool"]
    assert names(make(onMissing=""), [odd]) == ["odd"]  # "" is llm-d's Pass


def test_fallback_on_empty_returns_every_candidate() -> None:
    hot = [PODS[1], PODS[2]]
    assert names(make(), hot) == []
    assert names(make(fallbackOnEmpty=True), hot) == ["hot", "edge"]


def test_producer_names_the_key_read() -> None:
    mine = pod("mine", {("GPUUtilization", "my-dcgm"): 0.1})
    assert names(make(onMissing="Fail"), [mine]) == []
    assert names(make(onMissing="Fail", producer="my-dcgm"), [mine]) == ["mine"]
    agnostic = pod("a", {("llm-d.ai/queue", ""): 0})
    flt = make(attribute="llm-d.ai/queue", producer="", onMissing="Fail")
    assert names(flt, [agnostic]) == ["a"]


def test_no_producer_reads_the_core_metrics(caplog: pytest.LogCaptureFixture) -> None:
    algo = {"type": "threshold", "threshold": {"operator": "LessThan", "value": 0.5}}
    with caplog.at_level(logging.WARNING):
        flt = make(producer=None, attribute="KVCacheUsagePercent", algorithm=algo)
        flt.check_peers({"f": flt})
    assert flt.producer == "core-metrics-extractor" and not caplog.text
    pods = [
        ep("free", kv_cache_usage=0.1, updated_at=1.0),
        ep("full", kv_cache_usage=0.9, updated_at=1.0),
        ep("never-scraped"),  # missing: passes
    ]
    assert names(flt, pods) == ["free", "never-scraped"]


def test_a_custom_core_metric_no_extractor_publishes_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flt = make(producer=None, attribute="num_requests_running")
    with caplog.at_level(logging.WARNING):
        flt.check_peers({"f": flt})
    assert "core-metrics-extractor" in caplog.text and "does not declare" in caplog.text


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
