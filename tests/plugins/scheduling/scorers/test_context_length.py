"""context-length-aware: seed 002's formula, examples, label parsing and filter mode."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.context_length import (
    CONTEXT_LENGTH_LABEL,
    ContextLengthAware,
    ContextLengthParams,
    parse_ranges,
    range_score,
    request_chars,
)
from tests.helpers import ep
from tests.plugins.helpers import req

L = CONTEXT_LENGTH_LABEL


def plugin(**params: object) -> ContextLengthAware:
    return ContextLengthAware("c", ContextLengthParams.model_validate(params), None)  # type: ignore[arg-type]


def completion_of(tokens: int) -> object:
    return req("completions", {"prompt": "x" * (tokens * 4)})


def test_scenario_1_short_request() -> None:
    pods = [ep("A", {L: "0-2048"}), ep("B", {L: "2048-8192"}), ep("C")]
    got = plugin().score(CycleState(), completion_of(500), pods)  # type: ignore[arg-type]
    assert got["A"] == pytest.approx(0.7 / (1 + 0.2048) + 0.3 * 1548 / 2048)
    assert round(got["A"], 2) == 0.81
    assert got["B"] == 0.0
    assert got["C"] == 0.2


def test_scenario_2_overflow() -> None:
    pods = [ep("A", {L: "0-8192"}), ep("B", {L: "0-32768"})]
    got = plugin().score(CycleState(), completion_of(50_000), pods)  # type: ignore[arg-type]
    assert got["A"] == pytest.approx(0.25 + 0.25 * 8192 / 50_000)
    assert round(got["A"], 2) == 0.29
    assert round(got["B"], 2) == 0.41


def test_multiple_ranges_take_the_best() -> None:
    assert range_score(10_000, [(0, 2048), (8192, 16384)]) == pytest.approx(
        0.7 / (1 + 0.8192) + 0.3 * 6384 / 8192
    )
    # below the only matching-able range, above the other: overflow of the lower one
    assert range_score(4000, [(0, 2048), (8192, 16384)]) == pytest.approx(0.25 + 0.25 * 2048 / 4000)


def test_degenerate_range_exact_match() -> None:
    assert range_score(100, [(100, 100)]) == 1.0


@pytest.mark.parametrize("bad", ["", "abc", "1-2-3", "5-1", "-1-5", "1-x", "0-2048,"])
def test_unparsable_labels_score_zero(bad: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_ranges(bad)
    got = plugin().score(CycleState(), completion_of(10), [ep("p", {L: bad})])  # type: ignore[arg-type]
    assert got == {"p": 0.0}


def test_parse_ranges_with_spaces() -> None:
    assert parse_ranges(" 0 - 2048 , 8192-16384") == [(0, 2048), (8192, 16384)]


def test_filter_mode() -> None:
    pods = [
        ep("small", {L: "0-2048"}),
        ep("large", {L: "2048-32768"}),
        ep("any"),
        ep("broken", {L: "x"}),
    ]
    p = plugin(enableFiltering=True)
    short = p.filter(CycleState(), completion_of(500), pods)  # type: ignore[arg-type]
    long = p.filter(CycleState(), completion_of(20_000), pods)  # type: ignore[arg-type]
    huge = p.filter(CycleState(), completion_of(50_000), pods)  # type: ignore[arg-type]
    assert [e.name for e in short] == ["small", "any"]
    assert [e.name for e in long] == ["large", "any"]
    assert [e.name for e in huge] == ["any"]


def test_score_mode_does_not_filter() -> None:
    pods = [ep("small", {L: "0-2048"}), ep("large", {L: "2048-32768"})]
    assert plugin().filter(CycleState(), completion_of(50_000), pods) == pods  # type: ignore[arg-type]


def test_token_estimate_per_api() -> None:
    chat = req(
        "chat",
        {
            "messages": [
                {"role": "system", "content": "abcd"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "efgh"},
                        {"type": "image_url", "image_url": {"url": "data:..."}},
                    ],
                },
            ]
        },
    )
    assert request_chars(chat) == 8
    assert request_chars(req("completions", {"prompt": "x" * 10})) == 10
    assert request_chars(req("responses", {"input": "hello", "instructions": "ignored"})) == 5
    items = [{"role": "user", "content": [{"type": "input_text", "text": "abc"}]}]
    assert request_chars(req("responses", {"input": items})) == 3


def test_multiplier_and_real_tokens() -> None:
    p = plugin(charToTokenMultiplier=0.5)
    r = req("completions", {"prompt": "x" * 100})
    assert p.tokens(CycleState(), r) == 50  # type: ignore[arg-type]
    r2 = req("completions", {"prompt": "x" * 100})
    r2.token_ids = list(range(7))
    assert p.tokens(CycleState(), r2) == 7  # type: ignore[arg-type]


def test_custom_label() -> None:
    p = plugin(label="tier/ctx")
    got = p.score(
        CycleState(), completion_of(500), [ep("a", {"tier/ctx": "0-1000"}), ep("b", {L: "0-1000"})]
    )  # type: ignore[arg-type]
    assert got["a"] > 0.5
    assert got["b"] == 0.2
