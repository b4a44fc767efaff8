"""The estimate backend's made-up ids: the prompt's bytes, four to a token."""

from __future__ import annotations

import pytest

from heimdall_proxy.tokenization import TokenizeSkippedError
from heimdall_proxy.tokenization.estimate import (
    EstimateTokenizer,
    estimate_bytes,
    given_ids,
    pack_bytes,
)


def test_bytes_pack_little_endian_with_a_zero_padded_tail() -> None:
    assert pack_bytes(b"abcde") == [int.from_bytes(b"abcd", "little"), ord("e")]
    assert pack_bytes(b"") == []
    raw = "héllo wörld, the same prefix".encode()
    ids = pack_bytes(raw)
    assert b"".join(t.to_bytes(4, "little") for t in ids).rstrip(b"\x00") == raw


async def test_a_shared_text_prefix_is_a_shared_id_prefix() -> None:
    est = EstimateTokenizer()
    system = {"role": "system", "content": "You are a careful assistant. " * 4}
    a = await est.tokenize("chat", {"messages": [system, {"role": "user", "content": "one"}]})
    b = await est.tokenize("chat", {"messages": [system, {"role": "user", "content": "two"}]})
    common = len(b"system" + system["content"].encode() + b"user") // 4
    assert a[:common] == b[:common] and a != b
    assert len(a) == -(-len(b"system" + system["content"].encode() + b"userone") // 4)


def test_what_each_api_packs() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    chat = {"tools": tools, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}  # fmt: skip
    assert estimate_bytes("chat", chat) == b'[{"type":"function","function":{"name":"f"}}]userhi'
    assert estimate_bytes("completions", {"prompt": ["first", "second"]}) == b"first"
    assert estimate_bytes("responses", {"instructions": "be brief", "input": "hi"}) == b"be briefhi"
    with pytest.raises(TokenizeSkippedError):
        estimate_bytes("completions", {"prompt": [1, 2, 3]})
    with pytest.raises(TokenizeSkippedError):
        estimate_bytes("embeddings", {"input": "x"})


def test_media_is_one_aligned_token_that_tells_images_apart() -> None:
    def chat(url: str) -> dict[str, object]:
        parts = [{"type": "text", "text": "look"}, {"type": "text", "text": "!"},
                 {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip
        return {"messages": [{"role": "user", "content": parts}]}

    a, b = (
        estimate_bytes("chat", chat("http://x/a.png")),
        estimate_bytes("chat", chat("http://x/b.png")),
    )
    assert len(a) == len(b) == 16  # "userlook!" padded to 12, then one token
    assert a[:12] == b[:12] == b"userlook!\x00\x00\x00" and a[12:] != b[12:]


def test_ids_the_client_sent_are_real() -> None:
    assert given_ids("completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert given_ids("completions", {"prompt": [[5, 6], [7]]}) == [5, 6]
    assert given_ids("completions", {"prompt": "text"}) is None
    assert given_ids("chat", {"messages": []}) is None


async def test_a_prompt_over_the_bound_is_skipped() -> None:
    with pytest.raises(TokenizeSkippedError, match="maxPromptChars"):
        await EstimateTokenizer(max_prompt_chars=10).tokenize("completions", {"prompt": "x" * 11})
