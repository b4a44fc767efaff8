"""Go duration strings, the Duration field type and the PluginParams base model."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError

from heimdall_proxy.framework.params import Duration, NoParams, PluginParams, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2m", 120.0),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("0", 0.0),
        ("300us", 300e-6),
        ("300µs", 300e-6),
        ("10ns", 10e-9),
        ("1h2m3s4ms", 3723.004),
        (".5s", 0.5),
        ("-1.5s", -1.5),
        ("+2s", 2.0),
        ("-0", 0.0),
        ("  45s ", 45.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert math.isclose(parse_duration(text), seconds, rel_tol=1e-12, abs_tol=1e-15)


@pytest.mark.parametrize(
    "text", ["", "   ", "5", "5x", "m", "1m5", "s", "1 s", "1d", "-", "+", "."]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


class _Timeouts(BaseModel):
    ttl: Duration = 60.0


def test_duration_field_parses_strings() -> None:
    assert _Timeouts.model_validate({"ttl": "2m"}).ttl == 120.0
    assert _Timeouts.model_validate({"ttl": "250ms"}).ttl == 0.25
    assert _Timeouts().ttl == 60.0


@pytest.mark.parametrize("zero", [0, 0.0])
def test_duration_field_accepts_numeric_zero(zero: float) -> None:
    value = _Timeouts.model_validate({"ttl": zero}).ttl
    assert value == 0.0
    assert isinstance(value, float)


@pytest.mark.parametrize("bad", [True, False, 5, 1.5, -3, "5x", "", None, [1]])
def test_duration_field_rejects(bad: object) -> None:
    with pytest.raises(ValidationError) as info:
        _Timeouts.model_validate({"ttl": bad})
    assert info.value.errors()[0]["loc"] == ("ttl",)


class _Params(PluginParams):
    max_num_of_endpoints: int = 1
    block_size_tokens: int = 16
    lru_ttl: Duration = 30.0


def test_plugin_params_camel_case_aliases() -> None:
    params = _Params.model_validate({"maxNumOfEndpoints": 3, "blockSizeTokens": 64, "lruTtl": "1m"})
    assert params.max_num_of_endpoints == 3
    assert params.block_size_tokens == 64
    assert params.lru_ttl == 60.0
    assert params.model_extra == {}


def test_plugin_params_accepts_python_names_too() -> None:
    params = _Params.model_validate({"max_num_of_endpoints": 2})
    assert params.max_num_of_endpoints == 2


def test_plugin_params_defaults() -> None:
    params = _Params.model_validate({})
    assert (params.max_num_of_endpoints, params.block_size_tokens, params.lru_ttl) == (1, 16, 30.0)


def test_plugin_params_keeps_unknown_keys_in_model_extra() -> None:
    params = _Params.model_validate({"maxNumOfEndpoints": 2, "bogusKey": 1, "other": "x"})
    assert params.max_num_of_endpoints == 2
    assert params.model_extra == {"bogusKey": 1, "other": "x"}


def test_plugin_params_are_frozen() -> None:
    params = _Params.model_validate({})
    with pytest.raises(ValidationError):
        params.max_num_of_endpoints = 5  # type: ignore[misc]


def test_plugin_params_type_errors_name_the_alias() -> None:
    with pytest.raises(ValidationError) as info:
        _Params.model_validate({"maxNumOfEndpoints": "abc"})
    assert info.value.errors()[0]["loc"] == ("maxNumOfEndpoints",)


def test_no_params_keeps_everything_as_extra() -> None:
    assert NoParams.model_validate({"x": 1}).model_extra == {"x": 1}


def test_duration_field_reads_whole_nanoseconds_as_go_does() -> None:
    """llm-d's configs give some durations as Go's JSON does, in nanoseconds."""
    assert _Timeouts.model_validate({"ttl": 60_000_000_000}).ttl == 60.0
    assert _Timeouts.model_validate({"ttl": 1_000_000}).ttl == 0.001
    with pytest.raises(ValidationError, match="whole number of nanoseconds"):
        _Timeouts.model_validate({"ttl": 999_999})  # seconds without a unit, more likely
