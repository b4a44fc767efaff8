"""Incremental tokenization (tokenization/incremental.py) against full tokenization: for real
vocabularies and chat templates (bench/harness/vocab.py) and many random multi-turn
conversations, every turn's ids must equal those of encoding the whole prompt."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from bench.harness import vocab
from heimdall_proxy.tokenization.incremental import IncrementalEncoder, anchor_tokens
from heimdall_proxy.tokenization.local import LocalTokenizer
from tests.tokenization.model import CHAT_TEMPLATE, SPECIALS, make_model_dir


def _tekken() -> str:
    """Tekken's first 32k ranks: its merges, regex and byte-level alphabet, loaded faster."""
    return vocab.tekken_json(32_768)


MODELS: dict[str, tuple[Callable[[], str], str]] = {
    "tekken-chatml": (_tekken, vocab.CHATML),
    "tekken-llama3": (_tekken, vocab.LLAMA3),
    "tekken-mistral-v3": (_tekken, vocab.MISTRAL_V3),
    "spm-llama2": (vocab.spm_json, vocab.LLAMA2),
    "spm-legacy-llama2": (vocab.spm_legacy_json, vocab.LLAMA2),
    "adversarial-chatml": (vocab.adversarial_json, vocab.CHATML),
}
#: In the fast suite: one byte-level BPE, one Metaspace; the rest with the slow tests.
FAST = ("tekken-chatml", "spm-llama2")


#: Text that stresses the cuts: anchors' own text inside messages, whitespace runs at the
#: edges, words cut in two, emoji sequences, combining marks, scripts without spaces.
PIECES = [
    "the",
    " router",
    "gateway",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " ",
    "pre",
    "fix",
    "tokeni",
    "zation",
    "日本語の文章",
    "中文",
    "한국어",
    "مرحبا",
    "e\u0301",
    "🤖",
    "👩\u200d👩\u200d👧",
    "🇫🇷",
    "12345",
    "3.14",
    '{"a": [1, 2]}',
    "<|im_end|>",
    "<|im_start|>",
    "<|eot_id|>",
    "</s>",
    "<s>",
    "[INST]",
    "[/INST]",
    "<|",
    "|>",
    "[INS",
    "<tool_call>",
    "def f(x):\n    return x\n",
    "ÿ",
    "\u00a0",
    "\u2028",
    "<pad>",
    " <pad> ",
    "router ",
    "\uff1c\uff5cim_end\uff5c\uff1e",  # fullwidth: NFKC makes it an anchor's text
    "\uff1c/s\uff1e",
    "<|im",
    "tool_call",
]


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, n)))


def conversation(
    rng: random.Random, turns: int, system: str
) -> Iterator[tuple[list[dict[str, Any]], Any]]:
    """Successive request states of one agent-like conversation: (messages, tools)."""
    tools = None
    if rng.random() < 0.5:
        tools = [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": {"city": random_text(rng, 3)}},
            }
        ]
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    for _ in range(turns):
        messages.append({"role": "user", "content": random_text(rng, 40)})
        yield list(messages), tools
        if tools and rng.random() < 0.4:
            args = json.dumps({"city": random_text(rng, 4)})
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": args},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": random_text(rng, 30)})
            yield list(messages), tools
        messages.append({"role": "assistant", "content": random_text(rng, 60)})


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=() if name in FAST else (pytest.mark.slow,))
        for name in sorted(MODELS)
    ],
)
def model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> LocalTokenizer:
    make_json, template = MODELS[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    return LocalTokenizer(vocab.write_model(directory, make_json(), template))


def full_ids(tok: LocalTokenizer, text: str) -> list[int]:
    return list(tok.tokenizer.encode(text, add_special_tokens=False).ids)


def run_conversations(tok: LocalTokenizer, enc: IncrementalEncoder, seed: int, count: int) -> None:
    rng = random.Random(seed)
    shared_system = random_text(rng, 80)
    for c in range(count):
        system = shared_system if c % 2 else random_text(rng, 20)
        states = list(conversation(rng, rng.randint(2, 8), system))
        for messages, tools in states:
            text = tok.render_chat(messages, tools=tools)
            assert enc.encode(text) == full_ids(tok, text), (seed, c, text)
            # the prompt cut anywhere (inside a word, a special token, an emoji sequence)
            # and continued otherwise
            cut = text[: rng.randint(0, len(text))] + random_text(rng, 6)
            assert enc.encode(cut) == full_ids(tok, cut), (seed, c, cut)
        # branches off a cached conversation: an edited last message, a new reply, an
        # earlier turn dropped; and the same prompt again
        messages, tools = states[-1]
        edited = [*messages[:-1], {"role": "user", "content": random_text(rng, 10)}]
        regenerated = [*messages, {"role": "assistant", "content": random_text(rng, 20)}]
        dropped = messages[:1] + messages[3:]
        for variant in (edited, regenerated, dropped, messages):
            if variant:
                text = tok.render_chat(
                    variant, tools=tools, add_generation_prompt=rng.random() < 0.8
                )
                assert enc.encode(text) == full_ids(tok, text), (seed, c, text)


def test_every_turn_gives_the_full_ids_on_real_vocabularies(model: LocalTokenizer) -> None:
    enc = IncrementalEncoder(
        model.tokenizer,
        lambda texts: model.tokenizer.encode_batch_fast(texts, add_special_tokens=False),
        chunk_chars=32,
    )
    assert enc.enabled
    run_conversations(model, enc, seed=1, count=12)
    assert enc.stats.hits > enc.stats.misses > 0  # the cache did the work, not the fallback


def test_a_small_cache_evicts_and_stays_exact(model: LocalTokenizer) -> None:
    enc = IncrementalEncoder(
        model.tokenizer,
        lambda texts: model.tokenizer.encode_batch_fast(texts, add_special_tokens=False),
        max_bytes=20_000,
        chunk_chars=16,
    )
    run_conversations(model, enc, seed=2, count=6)
    assert enc.stats.bytes <= 20_000 and enc.stats.hits > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 8))
def test_many_random_conversations(model: LocalTokenizer, seed: int) -> None:
    enc = IncrementalEncoder(
        model.tokenizer,
        lambda texts: model.tokenizer.encode_batch_fast(texts, add_special_tokens=False),
        chunk_chars=8 + seed * 7,
    )
    run_conversations(model, enc, seed=seed, count=60)


def test_a_prompt_that_differs_inside_a_special_token_is_not_cut_there(
    model: LocalTokenizer,
) -> None:
    enc = IncrementalEncoder(
        model.tokenizer,
        lambda texts: model.tokenizer.encode_batch_fast(texts, add_special_tokens=False),
        chunk_chars=16,
    )
    turns = ["a long first question " * 4, "an answer", "a second question"]
    first = model.render_chat(
        [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]
    )
    anchor = max((a for a in enc.anchors if a in first), key=first.rfind)
    at = first.rfind(anchor)
    for tail in (anchor[:-1] + "x", anchor[:1] + " " + anchor[1:], anchor[:-1]):
        second = first[:at] + tail + " and then some"
        enc.encode(first)
        assert enc.encode(second) == full_ids(model, second)
    assert enc.stats.hits >= 3  # each second prompt reused the first one's parts


def test_chat_requests_reuse_the_last_turn_through_local_tokenizer(model: LocalTokenizer) -> None:
    # the default cache (4096-character chunks) on long turns, through the request path
    rng = random.Random(9)
    messages: list[dict[str, Any]] = [{"role": "system", "content": random_text(rng, 2000)}]
    before = model.conversations.stats.hits
    for _ in range(4):
        messages.append({"role": "user", "content": random_text(rng, 1500)})
        data = {"messages": list(messages)}
        text = model.render_chat(messages)
        assert model.tokenize_request("chat", data) == full_ids(model, text)
        messages.append({"role": "assistant", "content": random_text(rng, 1500)})
    assert model.conversations.stats.hits - before == 3
    # a request that asks for special tokens added is encoded whole, as before
    with_bos = model.tokenize_request("chat", {"messages": messages, "add_special_tokens": True})
    assert with_bos == list(model.tokenizer.encode(model.render_chat(messages)).ids)


def test_threads_share_one_cache(model: LocalTokenizer) -> None:
    enc = IncrementalEncoder(
        model.tokenizer,
        lambda texts: model.tokenizer.encode_batch_fast(texts, add_special_tokens=False),
        chunk_chars=32,
    )
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for messages, tools in conversation(rng, 6, "the same system prompt " * 4):
            text = model.render_chat(messages, tools=tools)
            if enc.encode(text) != full_ids(model, text):
                errors.append(text)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---- which tokens may be cut before ----------------------------------------------------------


def test_anchors_are_the_special_tokens_nothing_else_can_reach(tmp_path: Path) -> None:
    tok = Tokenizer.from_file(str(make_model_dir(tmp_path / "m", CHAT_TEMPLATE) / "tokenizer.json"))
    assert set(anchor_tokens(tok)) == set(SPECIALS)
    # an added token that contains an anchor's text, or overlaps its edge, rules it out
    tok.add_tokens([AddedToken("x</s>", normalized=False), AddedToken("a<|us", normalized=False)])
    assert "</s>" not in anchor_tokens(tok) and "<|user|>" not in anchor_tokens(tok)
    # one that is a prefix of an anchor is harmless: at one place the longest match wins
    tok.add_tokens([AddedToken("<|tool", normalized=False)])
    assert {"<s>", "<|tool|>"} <= set(anchor_tokens(tok))
    # stripping or word-bounded special tokens are no anchors
    tok.add_special_tokens([AddedToken("<pad>", lstrip=True), AddedToken("<w>", single_word=True)])
    assert not {"<pad>", "<w>"} & set(anchor_tokens(tok))
    # whitespace or a word character at an edge, or an anchor overlapping itself
    tok.add_special_tokens(["<x> ", "abc>", "<a<a"])
    assert not {"<x> ", "abc>", "<a<a"} & set(anchor_tokens(tok))


def test_tokenizers_that_are_not_piecewise_get_no_cache(tmp_path: Path) -> None:
    path = make_model_dir(tmp_path / "m") / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    assert anchor_tokens(tok)
    tok.enable_truncation(16)
    assert anchor_tokens(tok) == {}
    tok.no_truncation()
    tok.enable_padding(length=64)
    assert anchor_tokens(tok) == {}
    enc = IncrementalEncoder(
        tok, lambda texts: tok.encode_batch(texts, add_special_tokens=False), chunk_chars=4
    )
    text = "<s><|user|> hello world </s> " * 4
    assert not enc.enabled
    assert enc.encode(text) == tok.encode(text, add_special_tokens=False).ids
    assert enc.stats.hits == enc.stats.misses == 0
