"""The OpenAI SDK as the client, through the gateway, for all three APIs, stream and not."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import GatewayFactory, PodFactory, make_config


@pytest.fixture
async def client(start_pod: PodFactory, start_gateway: GatewayFactory) -> openai.AsyncOpenAI:
    pods = [await start_pod(), await start_pod()]
    gw = await start_gateway(make_config(pods))
    sdk = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="test", max_retries=0)
    yield sdk
    await sdk.close()


async def test_models(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["sim-model"]


async def test_completions(client: openai.AsyncOpenAI) -> None:
    out = await client.completions.create(model="sim-model", prompt="Hello there", max_tokens=4)
    assert out.object == "text_completion"
    assert out.choices[0].text == "the gateway routes tokens"
    assert out.usage is not None and out.usage.completion_tokens == 4


async def test_completions_stream(client: openai.AsyncOpenAI) -> None:
    stream = await client.completions.create(
        model="sim-model",
        prompt="Hello",
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, usage = [], None
    async for chunk in stream:
        texts.extend(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    assert "".join(texts) == "the gateway routes"
    assert usage is not None and usage.completion_tokens == 3


async def test_chat(client: openai.AsyncOpenAI) -> None:
    out = await client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert out.choices[0].message.content == "the gateway"
    assert out.choices[0].message.role == "assistant"


async def test_chat_stream(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=3,
        stream=True,
    )
    parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(parts) == "the gateway routes"


async def test_responses(client: openai.AsyncOpenAI) -> None:
    out = await client.responses.create(model="sim-model", input="hi", max_output_tokens=2)
    assert out.status == "completed"
    assert out.output_text == "the gateway"


async def test_responses_stream(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model="sim-model", input="hi", max_output_tokens=3, stream=True
    )
    kinds, deltas, final = [], [], None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            final = event.response
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert "".join(deltas) == "the gateway routes"
    assert final is not None and final.output_text == "the gateway routes"


async def test_unknown_model_is_sdk_not_found(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.completions.create(model="no-such-model", prompt="x")
    assert info.value.code == "model_not_found"


async def test_embeddings_go_through_default_profile(client: openai.AsyncOpenAI) -> None:
    out = await client.embeddings.create(model="sim-model", input="hi")
    assert out.data[0].embedding == [0.0, 0.5, 1.0]
