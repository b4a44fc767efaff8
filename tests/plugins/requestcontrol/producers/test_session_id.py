"""session-id-producer: the session id of a header or a cookie, published on the state."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.session import session_id_key
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.requestcontrol.producers.session_id import (
    SessionIDProducer,
    SessionIDProducerParams,
    cookie_value,
)
from tests.plugins.helpers import ledger, req


async def produced(params: dict[str, Any], headers: dict[str, str], name: str = "") -> Any:
    name = name or "session-id-producer"
    p = SessionIDProducer(name, SessionIDProducerParams.model_validate(params), ledger())
    state = CycleState()
    await p.produce(state, req(headers=headers), [])
    return state.get(session_id_key(name))


async def test_header_is_matched_case_insensitively_and_trimmed() -> None:
    assert await produced({"headerName": "X-Session-ID"}, {"x-session-id": " s-1 "}) == "s-1"


async def test_cookie() -> None:
    headers = {"cookie": "theme=dark; llm-d-session=abc123; other=x"}
    assert await produced({"cookieName": "llm-d-session"}, headers) == "abc123"
    assert await produced({"cookieName": "llm-d-session"}, {"cookie": "theme=dark"}) is None


async def test_nothing_is_published_without_a_session() -> None:
    assert await produced({"headerName": "x-session-id"}, {}) is None
    assert await produced({"headerName": "x-session-id"}, {"x-session-id": "  "}) is None


async def test_published_under_the_instance_name() -> None:
    assert await produced({"headerName": "x-s"}, {"x-s": "v"}, name="mine") == "v"
    assert session_id_key("mine") == "SessionIDDataKey/mine"
    assert session_id_key() == "SessionIDDataKey/session-id-producer"


@pytest.mark.parametrize(
    "params", [{}, {"headerName": "a", "cookieName": "b"}, {"headerName": " "}]
)
def test_exactly_one_source(params: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        SessionIDProducerParams.model_validate(params)


def test_cookie_value() -> None:
    assert cookie_value("a=1;b=2", "b") == "2"
    assert cookie_value("a=1; b", "b") == ""
    assert cookie_value("", "a") == ""
