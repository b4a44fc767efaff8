"""The Anthropic SDK as the client, through the gateway, on the Messages API (stream and
not) and count_tokens: llm-d's anthropic-parser reads the requests (in the default parser
list), the gateway reads the answers' usage into its metrics, and errors come back in
Anthropic's shape.

Slow-marked: importing the Anthropic SDK alone takes about 3 s, a thirteenth of the fast
suite's budget; CI runs it, and tests/e2e runs the same SDK against real vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import GatewayFactory, PodFactory, make_config

if TYPE_CHECKING:
    import anthropic

pytestmark = pytest.mark.slow


@pytest.fixture
async def gw(start_pod: PodFactory, start_gateway: GatewayFactory) -> Any:
    pods = [await start_pod(), await start_pod()]
    return await start_gateway(make_config(pods))


@pytest.fixture
async def client(gw: Any) -> anthropic.AsyncAnthropic:
    import anthropic  # here, not at the top: the fast suite collects this module

    sdk = anthropic.AsyncAnthropic(base_url=gw.url, api_key="test", max_retries=0)
    yield sdk
    await sdk.close()


MESSAGES = [{"role": "user", "content": "Hello there"}]
LABELS = {"model_name": "sim-model", "target_model_name": "sim-model"}


async def test_messages(client: anthropic.AsyncAnthropic, gw: Any) -> None:
    out = await client.messages.create(
        model="sim-model", max_tokens=4, system="Be brief.", messages=MESSAGES
    )
    assert out.type == "message" and out.role == "assistant"
    assert out.content[0].text == "the gateway routes tokens"  # type: ignore[union-attr]
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 4
    assert gw.metric("inference_objective_output_tokens_sum", LABELS) == 4
    prompt = gw.metric("inference_objective_input_tokens_sum", LABELS)
    assert prompt == out.usage.input_tokens


async def test_messages_stream(client: anthropic.AsyncAnthropic, gw: Any) -> None:
    async with client.messages.stream(model="sim-model", max_tokens=3, messages=MESSAGES) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "the gateway routes"
    assert final.usage.output_tokens == 3
    # the prompt's usage from message_start, the output's from message_delta
    assert gw.metric("inference_objective_output_tokens_sum", LABELS) == 3
    assert gw.metric("inference_objective_input_tokens_sum", LABELS) == final.usage.input_tokens


async def test_count_tokens(client: anthropic.AsyncAnthropic) -> None:
    out = await client.messages.count_tokens(model="sim-model", messages=MESSAGES)
    assert out.input_tokens > 0


async def test_a_bad_request_gets_anthropics_error_shape(client: anthropic.AsyncAnthropic) -> None:
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model="sim-model", max_tokens=4, messages=[])
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "messages" in body["error"]["message"]
