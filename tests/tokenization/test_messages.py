"""Messages API requests read as the chat requests vLLM's Anthropic front end makes of them."""

from __future__ import annotations

import json

from heimdall_proxy.tokenization import InProcessTokenizer
from heimdall_proxy.tokenization.estimate import EstimateTokenizer
from heimdall_proxy.tokenization.local import LocalTokenizer
from heimdall_proxy.tokenization.messages import as_chat, tokenizable


def test_system_text_blocks_and_one_text_block_become_plain_content() -> None:
    data = {
        "model": "m",
        "system": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "hello"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "max_tokens": 10,
    }
    assert as_chat(data) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
    }
    assert as_chat({"system": "s", "messages": []})["messages"] == [
        {"role": "system", "content": "s"}
    ]
    assert as_chat({"system": "", "messages": []})["messages"] == []  # an empty system: none


def test_tool_use_and_tool_result_as_vllm_converts_them() -> None:
    data = {
        "model": "m",
        "tools": [{"name": "get", "description": "fetch", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "look it up"},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "id": "t1",
                        "content": [{"type": "text", "text": "2C"}],
                    },
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
            {"role": "user", "content": [{"type": "image"}]},  # nothing it can use: dropped
        ],
    }
    chat = as_chat(data)
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "get", "description": "fetch", "parameters": {"type": "object"}},
        }
    ]
    assert chat["messages"] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "reasoning": "look it up",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "get", "arguments": json.dumps({"city": "Oslo"})},
                }
            ],
        },
        # the tool result goes before the message that carried it, as Python's str writes it
        {"role": "tool", "tool_call_id": "t1", "content": "[{'type': 'text', 'text': '2C'}]"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    assert chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'


def test_other_apis_are_read_as_they_are() -> None:
    body = {"prompt": "x"}
    assert tokenizable("completions", body) == ("completions", body)
    api, data = tokenizable(
        "messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert api == "chat" and data["messages"] == [{"role": "user", "content": "x"}]


async def test_a_messages_request_tokenizes_as_its_chat_request(tok: LocalTokenizer) -> None:
    messages = {
        "model": "m",
        "system": "the gateway",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello world"}]}],
        "max_tokens": 5,
    }
    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "the gateway"},
            {"role": "user", "content": "hello world"},
        ],
    }
    expected = tok.tokenize_request("chat", chat)
    assert expected  # the template rendered something
    in_process = InProcessTokenizer(tok)
    try:
        assert await in_process.tokenize("messages", messages) == expected
    finally:
        await in_process.close()
    estimate = EstimateTokenizer()
    assert await estimate.tokenize("messages", messages) == await estimate.tokenize("chat", chat)
