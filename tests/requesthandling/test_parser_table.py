"""Which parser reads which path: llm-d's longest-suffix rule and its fallback, with the
routes this gateway serves for each parser's claims."""

from __future__ import annotations

import logging

import pytest

from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.requesthandling.parsers import ParserTable
from tests.plugins.helpers import ledger


def parsers(*types: str) -> list[tuple[str, object]]:
    registry = load_builtin_plugins()
    out = []
    for t in types:
        spec = registry.get(t)
        assert spec is not None
        out.append((t, spec.factory(t, spec.params(), ledger())))
    return out


def test_the_longest_claimed_suffix_wins() -> None:
    table = ParserTable(parsers("openai-parser", "anthropic-parser", "sglanghttp-parser",
                                "vllmhttp-parser"))  # fmt: skip
    kind = {
        path: getattr(table.resolve(path), "type", None)
        for path in (
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/inference/v1/generate",  # "generate" is claimed too; the longer claim wins
            "/generate",
            "/prefix/v1/chat/completions",  # an allow-listed path, by its suffix
            "/v1/tokenize",
        )
    }
    assert kind == {
        "/v1/chat/completions": "openai-parser",
        "/v1/completions": "openai-parser",
        "/v1/messages": "anthropic-parser",
        "/v1/messages/count_tokens": "anthropic-parser",
        "/inference/v1/generate": "vllmhttp-parser",
        "/generate": "sglanghttp-parser",
        "/prefix/v1/chat/completions": "openai-parser",
        "/v1/tokenize": None,  # no fallback listed: refused
    }


def test_routes_are_the_claims_under_each_parsers_prefix() -> None:
    table = ParserTable(parsers("openai-parser", "anthropic-parser", "vllmhttp-parser"))
    assert table.claimed("/v1/chat/completions") is not None
    assert table.claimed("/v1/messages") is not None
    assert table.claimed("/inference/v1/generate") is not None
    # a suffix alone does not make a route: the gateway serves the canonical paths
    assert table.claimed("/chat/completions") is None
    assert table.claimed("/debug/route/v1/chat/completions") is None
    assert table.claimed("/generate") is None  # sglanghttp-parser is not listed


def test_a_parser_claiming_nothing_is_the_fallback_and_ends_the_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        table = ParserTable(parsers("vllmhttp-parser", "passthrough-parser", "openai-parser"))
    assert table.names == ["vllmhttp-parser", "passthrough-parser"]
    assert "never used: openai-parser" in caplog.text
    # the standard routes no listed parser claims are the fallback's; others are not routes
    fallback = table.claimed("/v1/chat/completions")
    assert getattr(fallback, "type", None) == "passthrough-parser"
    assert getattr(table.claimed("/inference/v1/generate"), "type", None) == "vllmhttp-parser"
    assert table.claimed("/v1/tokenize") is None
    assert table.resolve("/v1/tokenize") is fallback  # when allow-listed
