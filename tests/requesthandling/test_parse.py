"""parse_body's exact-type fast path must never accept a body pydantic would reject, and
bodies it passes on to pydantic keep pydantic's verdict and wording."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.types import ApiKind
from heimdall_proxy.requesthandling.parse import _MODELS, _plainly_valid, parse_body

#: Values of every JSON shape, including the ones pydantic's lax mode coerces.
VALUES: list[Any] = [None, "", "m", "true", 0, 5, -1, 5.0, 5.5, True, False, [], [1], {}, {"a": 1}]
FIELDS: dict[ApiKind, tuple[str, ...]] = {
    "completions": ("model", "stream", "max_tokens", "prompt", "stream_options", "n"),
    "chat": ("model", "messages", "stream", "max_completion_tokens", "n"),
    "responses": ("model", "input", "instructions", "store", "previous_response_id"),
    "other": ("model",),
}


def _bodies(api: ApiKind) -> list[dict[str, Any]]:
    """Every field alone with every value, on top of a valid base, and the base without
    each of its fields."""
    base: dict[str, Any] = {"model": "m"}
    if api == "chat":
        base["messages"] = [{"role": "user", "content": "hi"}]
    out = [dict(base)]
    for name, value in itertools.product(FIELDS[api], VALUES):
        out.append({**base, name: value})
    for name in base:
        out.append({k: v for k, v in base.items() if k != name})
    return out


@pytest.mark.parametrize("api", ["completions", "chat", "responses", "other"])
def test_fast_path_accepts_only_what_pydantic_accepts(api: ApiKind) -> None:
    fast_accepted = 0
    for data in _bodies(api):
        if _plainly_valid(api, data):
            fast_accepted += 1
            _MODELS[api].model_validate(data)  # must not raise
    assert fast_accepted > len(FIELDS[api])  # the fast path is actually taken


@pytest.mark.parametrize("api", ["completions", "chat", "responses", "other"])
def test_verdict_matches_pydantic(api: ApiKind) -> None:
    """parse_body accepts exactly the bodies pydantic accepts (chat also checks messages)."""
    for data in _bodies(api):
        try:
            _MODELS[api].model_validate(data)
            expected = api != "chat" or all(isinstance(m, dict) for m in data["messages"])
        except ValidationError:
            expected = False
        body = orjson.dumps(data)
        status = 200
        try:
            parse_body(api, "/v1/x", body, {})
        except RequestError as exc:
            status = exc.status
        assert status == (200 if expected else 400), data


def test_coerced_values_still_go_through_pydantic() -> None:
    # "true" is not a bool to the fast path; pydantic's lax mode accepts it, as vLLM does.
    req = parse_body(
        "chat", "/v1/chat/completions", b'{"model":"m","messages":[],"stream":"true"}', {}
    )
    assert req.stream is True
    with pytest.raises(RequestError) as err:
        parse_body("chat", "/v1/chat/completions", b'{"model":"m","messages":[],"n":"x"}', {})
    assert err.value.param == "n"
