"""The Anthropic SDK through the gateway against real vLLM (its /v1/messages front end):
anthropic-parser, in the default parser list, reads the requests and their answers' usage.
Deselected by default; run as tests/e2e/test_real_vllm.py says."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import HEADER, MODEL, GatewayProcess, Pod, http_get

pytestmark = [pytest.mark.e2e_vllm, pytest.mark.timeout(600)]

MESSAGES = [{"role": "user", "content": "Which pod serves this?"}]
#: The model has random weights: ignore_eos keeps the answer's length exact.
LENGTH: dict[str, Any] = {"max_tokens": 8, "extra_body": {"ignore_eos": True}}


@pytest.fixture
def claude(gateway: GatewayProcess) -> Iterator[Any]:
    import anthropic

    with anthropic.Anthropic(
        base_url=gateway.url, api_key="unused", max_retries=0, timeout=120
    ) as c:
        yield c


def _output_tokens(gateway: GatewayProcess) -> float:
    _, text = http_get(f"{gateway.url}/metrics")
    total = 0.0
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == "inference_objective_output_tokens_sum":
                total += sample.value
    return total


def test_messages(claude: Any, pods: list[Pod], gateway: GatewayProcess) -> None:
    before = _output_tokens(gateway)
    raw = claude.messages.with_raw_response.create(
        model=MODEL, system="You are terse.", messages=MESSAGES, **LENGTH
    )
    assert raw.headers[HEADER] in {p.host_port for p in pods}
    reply = raw.parse()
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.content and reply.content[0].type == "text"
    assert reply.usage.output_tokens == 8 and reply.usage.input_tokens > 1
    assert _output_tokens(gateway) - before == 8  # the gateway read the answer's usage


def test_messages_stream(claude: Any, gateway: GatewayProcess) -> None:
    before = _output_tokens(gateway)
    with claude.messages.stream(model=MODEL, messages=MESSAGES, **LENGTH) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert isinstance(text, str)
    assert final.usage.output_tokens == 8
    assert _output_tokens(gateway) - before == 8  # from the stream's message_delta


def test_count_tokens(claude: Any) -> None:
    out = claude.messages.count_tokens(model=MODEL, messages=MESSAGES)
    assert out.input_tokens > 1
