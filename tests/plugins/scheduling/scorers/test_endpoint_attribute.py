"""endpoint-attribute-scorer: linear scores of a numeric Endpoint attribute, over the
candidates' range or a fixed one, with the attributes set on the pods directly."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import CycleState, Endpoint
from heimdall_proxy.plugins.scheduling.scorers.endpoint_attribute import (
    EndpointAttributeScorer,
    EndpointAttributeScorerParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

KEY = ("custom.queue_depth", "my-extractor")


def pod(name: str, value: object = None) -> Endpoint:
    e = ep(name)
    if value is not None:
        e.attributes[KEY] = value
    return e


def make(algorithm: dict[str, Any], **extra: Any) -> EndpointAttributeScorer:
    params = {
        "attributeKey": "custom.queue_depth",
        "producer": "my-extractor",
        "algorithm": algorithm,
        **extra,
    }
    p = EndpointAttributeScorerParams.model_validate(params)
    return EndpointAttributeScorer("s", p, ledger())


def scores(scorer: EndpointAttributeScorer, pods: list[Endpoint]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in scorer.score(CycleState(), req(), pods).items()}


PODS = [pod("a", 0), pod("b", 5), pod("c", 10), pod("none")]


def test_adaptive_range_lower_is_better() -> None:
    s = make({"type": "linear_lower_is_better"})
    assert scores(s, PODS) == {"a": 1.0, "b": 0.5, "c": 0.0, "none": 0.0}


def test_adaptive_range_higher_is_better() -> None:
    s = make({"type": "linear_higher_is_better", "normalization": {"adaptiveRange": {}}})
    assert scores(s, PODS) == {"a": 0.0, "b": 0.5, "c": 1.0, "none": 0.0}


def test_adaptive_range_of_one_value_is_a_neutral_tie() -> None:
    s = make({"type": "linear_lower_is_better"})
    assert scores(s, [pod("a", 3), pod("b", 3), pod("c")]) == {"a": 1.0, "b": 1.0, "c": 0.0}
    assert scores(s, [pod("a"), pod("b")]) == {"a": 0.0, "b": 0.0}


def test_fixed_range_clamps() -> None:
    s = make(
        {
            "type": "linear_lower_is_better",
            "normalization": {"fixedRange": {"min": 0.0, "max": 1.0}},
        }
    )
    pods = [pod("low", 0.25), pod("over", 1.5), pod("under", -2), pod("none")]
    assert scores(s, pods) == {"low": 0.75, "over": 0.0, "under": 1.0, "none": 0.0}


@pytest.mark.parametrize(
    "algorithm",
    [
        {"type": "quadratic"},
        {"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 1, "max": 1}}},
        {"type": "linear_lower_is_better", "normalization": {"fixedRange": {}}},
        {
            "type": "linear_lower_is_better",
            "normalization": {"fixedRange": {"min": 0, "max": 1}, "adaptiveRange": {}},
        },
    ],
)
def test_invalid_algorithms_are_refused(algorithm: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        make(algorithm)


def test_attribute_key_with_a_slash_needs_a_producer() -> None:
    with pytest.raises(ValidationError, match="separate parameters"):
        make({"type": "linear_lower_is_better"}, attributeKey="a/b", producer=None)
    s = make({"type": "linear_lower_is_better"}, attributeKey="a/b", producer="")
    assert (s.attribute, s.producer) == ("a/b", "")
