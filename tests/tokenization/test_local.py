"""In-process tokenization of OpenAI requests: completions, chat templates, responses."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from heimdall_proxy.tokenization import InProcessTokenizer, TokenizeSkippedError
from heimdall_proxy.tokenization.local import (
    ChatTemplateError,
    LocalTokenizer,
    prompt_chars,
    responses_messages,
)
from tests.tokenization.model import make_model_dir

CHAT = [{"role": "system", "content": "the gateway"}, {"role": "user", "content": "hello world"}]


def test_completions_add_bos_unless_told_not_to(tok: LocalTokenizer) -> None:
    ids = tok.tokenize_request("completions", {"prompt": "hello world"})
    assert ids[0] == tok.tokenizer.token_to_id("<s>")
    assert ids[1:] == tok.encode("hello world", add_special_tokens=False)
    assert tok.tokenize_request(
        "completions", {"prompt": "hello", "add_special_tokens": False}
    ) == [tok.tokenizer.token_to_id("hello")]
    # prompts already tokenized, and batches (routed on their first prompt)
    assert tok.tokenize_request("completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert tok.tokenize_request("completions", {"prompt": [[9, 8], [1]]}) == [9, 8]
    assert tok.tokenize_request("completions", {"prompt": ["hello", "world"]}) == tok.encode(
        "hello"
    )
    with pytest.raises(ValueError, match="no text prompt"):
        tok.tokenize_request("completions", {"prompt": 3})


def test_encode_gives_the_ids_of_tokenizers_own_encode(tok: LocalTokenizer) -> None:
    # encode goes through the batch call (it releases the GIL): the same ids as encode
    for text in ("hello world", "<s><|user|> the pod </s> <|assistant|> ", "", "zzz unknown"):
        for special in (True, False):
            want = tok.tokenizer.encode(text, add_special_tokens=special).ids
            assert tok.encode(text, add_special_tokens=special) == want
    ids, offsets = tok.encode_with_offsets("hello world")
    assert ids == tok.encode("hello world") and offsets[1:] == [(0, 5), (6, 11)]


def test_chat_is_rendered_with_the_template_then_tokenized_without_bos(tok: LocalTokenizer) -> None:
    text = tok.render_chat(CHAT)
    assert text == "<s><|system|> the gateway </s> <|user|> hello world </s> <|assistant|> "
    ids = tok.tokenize_request("chat", {"messages": CHAT})
    assert ids == tok.encode(text, add_special_tokens=False)
    assert ids.count(tok.tokenizer.token_to_id("<s>")) == 1  # the template's BOS, not a second
    no_gen = tok.tokenize_request("chat", {"messages": CHAT, "add_generation_prompt": False})
    assert no_gen == ids[:-1]


def test_template_inputs(tok: LocalTokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    assert "<|tool|> 1" in tok.render_chat(CHAT, tools=tools)
    assert "hello thanks" not in tok.render_chat(CHAT)
    assert "thanks <|assistant|>" in tok.render_chat(
        CHAT, chat_template_kwargs={"greeting": "thanks"}
    )
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}],
        }
    ]
    assert "<|user|> hello\nworld </s>" in tok.render_chat(parts)
    with pytest.raises(ChatTemplateError, match="unknown role"):
        tok.render_chat([{"role": "wizard", "content": "x"}])
    cont = tok.render_chat(
        [*CHAT, {"role": "assistant", "content": "the answer"}], continue_final_message=True
    )
    assert cont.endswith("<|assistant|> the answer")


def test_tool_call_arguments_are_parsed_for_the_template(tmp_path: Path) -> None:
    template = (
        "{% for m in messages %}{% for c in m.get('tool_calls') or [] %}"
        "{{ c['function']['arguments']['location'] }}{% endfor %}{% endfor %}"
    )
    tok = LocalTokenizer(make_model_dir(tmp_path / "m", template) / "tokenizer.json")
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"location": "paris"})},
    }
    assert (
        tok.render_chat([{"role": "assistant", "content": None, "tool_calls": [call]}]) == "paris"
    )


def test_template_sources(tmp_path: Path) -> None:
    none = LocalTokenizer(make_model_dir(tmp_path / "none", None) / "tokenizer.json")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        none.tokenize_request("chat", {"messages": CHAT})
    named = make_model_dir(
        tmp_path / "named",
        [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}],
    )
    assert LocalTokenizer(named / "tokenizer.json").render_chat(CHAT) == "DEFAULT"
    jinja = make_model_dir(tmp_path / "jinja")
    (jinja / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.role }}]{% endfor %}")
    assert LocalTokenizer(jinja / "tokenizer.json").render_chat(CHAT) == "[system][user]"
    as_json = make_model_dir(tmp_path / "json", None)
    (as_json / "chat_template.json").write_text(
        json.dumps({"chat_template": "J{{ messages|length }}"})
    )
    assert LocalTokenizer(as_json / "tokenizer.json").render_chat(CHAT) == "J2"
    # a template that loops over the content gets the parts (vLLM's "openai" content format)
    parts = make_model_dir(
        tmp_path / "parts",
        "{% for m in messages %}{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}{% endfor %}",
    )
    msg = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert LocalTokenizer(parts / "tokenizer.json").render_chat(msg) == "<a><b>"
    gen = make_model_dir(
        tmp_path / "gen", "{% generation %}G{{ messages|length }}{% endgeneration %}"
    )
    assert LocalTokenizer(gen / "tokenizer.json").render_chat(CHAT) == "G2"


def test_responses_become_chat_messages(tok: LocalTokenizer) -> None:
    body = {"instructions": "the gateway", "input": "hello world"}
    assert responses_messages(body) == CHAT
    assert tok.tokenize_request("responses", body) == tok.tokenize_request(
        "chat", {"messages": CHAT}
    )
    items = {
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
            {"type": "input_text", "text": "world"},
            "junk",
        ]
    }
    assert responses_messages(items) == [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "user", "content": "world"},
    ]


async def test_in_process_tokenizer_runs_long_inputs_on_a_thread(tok: LocalTokenizer) -> None:
    svc = InProcessTokenizer(tok, workers=2)
    try:
        short = await svc.tokenize("completions", {"prompt": "hello world"}, size_hint=30)
        long = await svc.tokenize(
            "completions", {"prompt": "hello world " * 2000}, size_hint=30_000
        )
        assert short == tok.encode("hello world")
        assert len(long) == 4001
    finally:
        await svc.close()


def test_prompt_chars_counts_what_the_tokenizer_reads() -> None:
    assert prompt_chars("completions", {"prompt": "hello"}) == 5
    assert prompt_chars("completions", {"prompt": ["hello", "a much longer one"]}) == 5
    assert prompt_chars("completions", {"prompt": [1, 2, 3]}) == 0
    assert prompt_chars("completions", {"prompt": 3}) == 0
    chat = [
        {"role": "system", "content": "abc"},
        {"role": "user", "content": [{"type": "text", "text": "hello"}, "xy", {"type": "i"}]},
        "junk",
    ]
    assert prompt_chars("chat", {"messages": chat}) == 10
    assert prompt_chars("chat", {"messages": "nope"}) == 0
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hey"}]},
             {"type": "input_text", "text": "you"}, 7]  # fmt: skip
    assert prompt_chars("responses", {"instructions": "be", "input": items}) == 8
    assert prompt_chars("responses", {"input": "hello"}) == 5


class _Gate:
    """A PromptTokenizer whose calls for long prompts wait until the test opens the gate."""

    def __init__(self, tok: LocalTokenizer) -> None:
        self.tok = tok
        self.gate = threading.Event()
        self.started = threading.Event()

    def tokenize_request(self, api: str, data: Mapping[str, Any]) -> list[int]:
        if prompt_chars(api, data) > 100:
            self.started.set()
            self.gate.wait(5)
        return self.tok.tokenize_request(api, data)


async def test_in_process_tokenizer_bounds_its_work(tok: LocalTokenizer) -> None:
    gated = _Gate(tok)
    svc = InProcessTokenizer(gated, workers=1, max_prompt_chars=10_000, max_pending_chars=15_000)
    big = {"prompt": "hello " * 1500}  # 9,000 characters
    try:
        with pytest.raises(TokenizeSkippedError, match="over maxPromptChars"):
            await svc.tokenize("completions", {"prompt": "hello " * 2000}, size_hint=12_000)
        assert svc.pending == 0
        first = asyncio.create_task(svc.tokenize("completions", big, size_hint=9_100))
        await asyncio.to_thread(gated.started.wait, 5)
        # 9,000 more would make 18,000 pending: over the bound, so not queued
        with pytest.raises(TokenizeSkippedError, match="queued"):
            await svc.tokenize("completions", big, size_hint=9_100)
        # nor is it tokenized inline when its body is short (responses-store expanded it)
        with pytest.raises(TokenizeSkippedError, match="queued"):
            await svc.tokenize("completions", big, size_hint=100)
        # a small one still fits in the budget, and a short body is tokenized inline
        second = asyncio.create_task(
            svc.tokenize("completions", {"prompt": "hello world " * 500}, size_hint=6_100)
        )
        await asyncio.sleep(0)  # second is submitted
        assert await svc.tokenize("completions", {"prompt": "hi"}, size_hint=20) == tok.encode("hi")
        assert (svc.pending, svc.pending_chars) == (2, 15_000)
        # a cancelled request's work counts until the thread is done with it
        first.cancel()
        await asyncio.sleep(0.01)
        assert svc.pending == 2
        gated.gate.set()
        assert len(await second) == 1001
        assert (svc.pending, svc.pending_chars) == (0, 0)
        assert len(await svc.tokenize("completions", big, size_hint=9_100)) == 1501
    finally:
        gated.gate.set()
        await svc.close()
