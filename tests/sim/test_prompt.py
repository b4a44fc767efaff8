"""The simulator reads prompts on its own (sim/prompt.py); on every body shape the gateway
routes, both readings must agree, or one of them has a bug."""

from __future__ import annotations

from typing import Any

import pytest

from heimdall_proxy.framework.types import extract_prompt_text
from heimdall_proxy.sim.prompt import ApiKind, prompt_text

BODIES: list[tuple[ApiKind, dict[str, Any], str]] = [
    ("completions", {"prompt": "hello world"}, "hello world"),
    ("completions", {"prompt": ["a", "b", 3]}, "ab"),
    ("completions", {"prompt": [1, 2, 3]}, ""),
    ("chat", {"messages": [{"role": "system", "content": "sys"}, {"content": "hi"}]}, "syshi"),
    (
        "chat",
        {
            "messages": [
                {
                    "content": [
                        {"type": "text", "text": "look "},
                        {"type": "image_url", "image_url": {"url": "x"}},
                        "plain",
                    ]
                },
                "not a message",
            ]
        },
        "look plain",
    ),
    ("chat", {"messages": "nope"}, ""),
    ("responses", {"instructions": "be brief. ", "input": "what?"}, "be brief. what?"),
    (
        "responses",
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "q1"}]},
                {"type": "input_text", "text": "q2"},
                7,
            ]
        },
        "q1q2",
    ),
    ("other", {"prompt": "ignored"}, ""),
]


@pytest.mark.parametrize(("api", "body", "text"), BODIES)
def test_simulator_and_gateway_read_the_same_prompt(
    api: ApiKind, body: dict[str, Any], text: str
) -> None:
    assert prompt_text(api, body) == text
    assert extract_prompt_text(api, body) == text
