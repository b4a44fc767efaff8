"""by-label-selector filter: Kubernetes label-selector semantics."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.scheduling.filters.by_label_selector import (
    BY_LABEL_SELECTOR_TYPE,
    ByLabelSelectorFilter,
    ByLabelSelectorParams,
)
from tests.helpers import ep


def req() -> InferenceRequest:
    return InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})


def run(params: dict[str, Any], pods: list[Endpoint]) -> list[str]:
    flt = ByLabelSelectorFilter(
        "sel",
        ByLabelSelectorParams.model_validate(params),
        PluginHandle(pool=None),  # type: ignore[arg-type]
    )
    return [e.name for e in flt.filter(CycleState(), req(), pods)]


PODS = [
    ep("a", {"app": "vllm", "tier": "gold", "zone": "z1"}),
    ep("b", {"app": "vllm", "tier": "silver"}),
    ep("c", {"app": "vllm"}),
    ep("d", {"app": "other", "tier": "gold"}),
    ep("e"),
]


def test_type_name() -> None:
    assert BY_LABEL_SELECTOR_TYPE == "by-label-selector"


@pytest.mark.parametrize("params", [{}, {"matchLabels": {}, "matchExpressions": []}])
def test_empty_selector_keeps_all(params: dict[str, Any]) -> None:
    assert run(params, PODS) == ["a", "b", "c", "d", "e"]


def test_match_labels_requires_every_pair() -> None:
    assert run({"matchLabels": {"app": "vllm"}}, PODS) == ["a", "b", "c"]
    assert run({"matchLabels": {"app": "vllm", "tier": "gold"}}, PODS) == ["a"]
    assert run({"matchLabels": {"tier": "bronze"}}, PODS) == []


def test_in() -> None:
    expr = {"key": "tier", "operator": "In", "values": ["gold", "silver"]}
    assert run({"matchExpressions": [expr]}, PODS) == ["a", "b", "d"]


def test_not_in_matches_pods_without_the_key() -> None:
    expr = {"key": "tier", "operator": "NotIn", "values": ["gold"]}
    assert run({"matchExpressions": [expr]}, PODS) == ["b", "c", "e"]


def test_exists() -> None:
    assert run({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, PODS) == ["a"]


def test_does_not_exist() -> None:
    expr = {"key": "tier", "operator": "DoesNotExist"}
    assert run({"matchExpressions": [expr]}, PODS) == ["c", "e"]


def test_labels_and_expressions_are_anded() -> None:
    params = {
        "matchLabels": {"app": "vllm"},
        "matchExpressions": [
            {"key": "tier", "operator": "Exists"},
            {"key": "zone", "operator": "DoesNotExist"},
        ],
    }
    assert run(params, PODS) == ["b"]


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ({"key": "tier", "operator": "In"}, "operator In needs a non-empty values list"),
        ({"key": "tier", "operator": "In", "values": []}, "needs a non-empty values list"),
        ({"key": "tier", "operator": "NotIn"}, "operator NotIn needs a non-empty values list"),
        ({"key": "tier", "operator": "Exists", "values": ["x"]}, "operator Exists takes no values"),
        ({"key": "t", "operator": "DoesNotExist", "values": ["x"]}, "DoesNotExist takes no values"),
        ({"key": "tier", "operator": "Equals", "values": ["x"]}, "operator"),
        ({"key": "tier", "operator": "in", "values": ["x"]}, "operator"),
        ({"operator": "Exists"}, "key"),
    ],
)
def test_invalid_requirements(expr: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        ByLabelSelectorParams.model_validate({"matchExpressions": [expr]})


def test_match_labels_must_be_a_string_map() -> None:
    with pytest.raises(ValidationError, match="matchLabels"):
        ByLabelSelectorParams.model_validate({"matchLabels": ["app=vllm"]})


def test_llm_d_canonical_name_and_the_old_one_are_the_same_filter() -> None:
    from heimdall_proxy.plugins.builtins import load_builtin_plugins

    registry = load_builtin_plugins()
    canonical, old = registry.get("label-selector-filter"), registry.get("by-label-selector")
    assert canonical is not None and old is not None
    assert canonical.factory is old.factory is ByLabelSelectorFilter
    assert ByLabelSelectorFilter.type == "label-selector-filter"
