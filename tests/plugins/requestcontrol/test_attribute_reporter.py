"""request-attribute-reporter: the README's CEL examples over an answer's usage, the
compile-time checks, and the value reported through a gateway."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from heimdall_proxy.config.gateway import ConfigError
from heimdall_proxy.plugins.requestcontrol.attribute_reporter import (
    ReporterParams,
    RequestAttributeReporter,
)
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config
from tests.helpers import ep
from tests.plugins.datalayer.test_models import build
from tests.plugins.helpers import ctx, ledger, req

TOTAL = "(has(usage.prompt_tokens) ? usage.prompt_tokens : 0) + (has(usage.completion_tokens) ? usage.completion_tokens : 0)"


def reporter(expression: str, condition: str = "", **key: str) -> RequestAttributeReporter:
    params = ReporterParams.model_validate(
        {
            "attributes": [
                {
                    "key": {"name": "x-gateway-inference-request-cost", **key},
                    "expression": expression,
                    "condition": condition,
                }
            ]
        }
    )
    return RequestAttributeReporter("cost", params, ledger())


USAGE = {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}


def test_readme_examples() -> None:
    assert reporter(TOTAL).value(USAGE) == 42
    assert reporter("usage.prompt_tokens").value(USAGE) == 12
    only = reporter("usage.completion_tokens", "has(usage.completion_tokens)")
    assert only.value(USAGE) == 30
    assert only.value({"prompt_tokens": 12}) is None  # the condition does not hold
    both = "has(usage.prompt_tokens) && has(usage.completion_tokens)"
    assert reporter("usage.prompt_tokens + usage.completion_tokens", both).value(USAGE) == 42


def test_zero_errors_and_non_numbers_are_not_reported() -> None:
    assert reporter("usage.completion_tokens").value({"completion_tokens": 0}) is None
    assert reporter("usage.missing").value(USAGE) is None  # no such key: an eval error
    assert reporter("usage.prompt_tokens + 1").value(USAGE) is None  # double + int: no overload
    assert reporter("'text'").value(USAGE) is None
    assert reporter("usage.prompt_tokens / 5.0").value(USAGE) == 2  # truncated


def test_namespace_defaults_to_envoy_lb() -> None:
    assert reporter("1").namespace == "envoy.lb"
    assert reporter("1", namespace="billing").namespace == "billing"


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ([], "exactly one entry"),
        ([{"key": {"name": "a"}, "expression": "1"}] * 2, "exactly one entry"),
        ([{"key": {"name": ""}, "expression": "1"}], "key.name cannot be empty"),
        ([{"key": {"name": "a"}, "expression": ""}], "expression cannot be empty"),
    ],
)
def test_parameters_are_checked(attributes: list[Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ReporterParams.model_validate({"attributes": attributes})


def test_a_syntax_error_refuses_the_config() -> None:
    doc = {
        "plugins": [
            {
                "type": "request-attribute-reporter",
                "parameters": {"attributes": [{"key": {"name": "a"}, "expression": "usage.+"}]},
            }
        ]
    }
    with pytest.raises(ConfigError, match="failed to compile expression"):
        build(doc)


async def test_hook_adds_the_value_to_the_counter() -> None:
    plugin = reporter("usage.completion_tokens", "has(usage.completion_tokens)")
    c = ctx(req(), ep("a"))
    c.status, c.prompt_tokens, c.output_tokens = 200, 5, 7
    await plugin.response_complete(c)
    c.error = "client went away"
    await plugin.response_complete(c)  # a failed attempt reports nothing
    (sample,) = [s for s in plugin.reported.collect().samples if s.name.endswith("_total")]
    assert sample.value == 7.0
    assert sample.labels == {
        "namespace": "envoy.lb",
        "name": "x-gateway-inference-request-cost",
        "model_name": "m",
        "target_model_name": "m",
    }


async def test_through_a_gateway(start_pod: PodFactory, start_gateway: GatewayFactory) -> None:
    epp = {
        "plugins": [
            {
                "name": "total-tokens-cost-reporter",
                "type": "request-attribute-reporter",
                "parameters": {
                    "attributes": [
                        {
                            "key": {"namespace": "envoy.lb", "name": "cost"},
                            "expression": "usage.completion_tokens",
                            "condition": "has(usage.completion_tokens)",
                        }
                    ]
                },
            },
            {"type": "queue-scorer"},
        ]
    }
    gw = await start_gateway(make_config([await start_pod()], epp))
    async with aiohttp.ClientSession() as http:
        for stream in (False, True):
            body = {"model": "sim-model", "prompt": "hello", "max_tokens": 3, "stream": stream}
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
                await r.read()
    labels = {
        "namespace": "envoy.lb",
        "name": "cost",
        "model_name": "sim-model",
        "target_model_name": "sim-model",
    }
    await eventually(lambda: gw.metric("heimdall_request_attribute_total", labels) == 6.0)
