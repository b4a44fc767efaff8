"""Property-based fuzzing of everything a client or a pod controls: request bodies, headers,
request targets and KV-event payloads. Bounded (max_examples) so the suite stays fast; each
property says what must hold for any input, not for the inputs we thought of."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.kvcache.events import EventDecodeError, decode_batch
from heimdall_proxy.requesthandling.parse import parse_body
from heimdall_proxy.requesthandling.untrusted import TRANSFER_FIELDS, untrusted_fields
from heimdall_proxy.server.app import check_target
from heimdall_proxy.server.headers import OWNED, upstream_request_headers


def attempt(fn: Any, *args: Any) -> tuple[Any, RequestError | None]:
    """(result, None), or (None, the RequestError fn raised); anything else propagates."""
    try:
        return fn(*args), None
    except RequestError as exc:
        return None, exc


#: The suite's run is derandomized (the same examples every time, so CI is deterministic);
#: HEIMDALL_FUZZ=N explores N fresh random examples per property instead.
_WIDE = int(os.environ.get("HEIMDALL_FUZZ", "0"))
FUZZ = settings(
    max_examples=_WIDE or 250,
    derandomize=not _WIDE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
fields = st.sampled_from(
    ["model", "messages", "prompt", "input", "stream", "max_tokens", "max_completion_tokens",
     "n", "instructions", "previous_response_id", "request_id", "kv_transfer_params",
     "ec_transfer_params", "cache_salt", "stream_options", "role", "content"]
)  # fmt: skip
bodies = st.dictionaries(fields | st.text(max_size=8), json_values, max_size=8)
apis = st.sampled_from(["completions", "chat", "responses", "other"])


@FUZZ
@given(api=apis, raw=st.binary(max_size=256))
def test_any_bytes_parse_or_fail_with_a_request_error(api: Any, raw: bytes) -> None:
    _, exc = attempt(parse_body, api, "/v1/x", raw, {})
    assert exc is None or (400 <= exc.status < 500 and exc.message)


@pytest.mark.slow
@FUZZ
@given(api=apis, body=bodies, trusted=st.booleans())
def test_any_json_body_parses_or_fails_cleanly_and_never_keeps_what_clients_must_not_set(
    api: Any, body: dict[str, Any], trusted: bool
) -> None:
    req, exc = attempt(parse_body, api, "/v1/x", orjson.dumps(body), {})
    if exc is not None:
        assert 400 <= exc.status < 500
        return
    req.prompt_text()  # whatever the body holds, reading its prompt never raises
    untrusted_fields(req, trusted)
    if not trusted:
        assert not any(f in req.data for f in TRANSFER_FIELDS)
    if api == "responses":
        assert "request_id" not in req.data


header_names = st.sampled_from(
    ["Connection", "Keep-Alive", "Host", "Content-Length", "Content-Encoding", "mif-prefill-endpoint",
     "X-Gateway-Destination-Endpoint", "x-decoder-host-port", "Authorization", "X-Custom",
     "TE", "Upgrade"]
) | st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)  # fmt: skip


@FUZZ
@given(st.lists(st.tuples(header_names, st.text(max_size=20)), max_size=12))
def test_headers_the_gateway_owns_or_hops_drop_never_cross(pairs: list[tuple[str, str]]) -> None:
    headers = CIMultiDictProxy(CIMultiDict(pairs))
    out = upstream_request_headers(headers)
    connection = {t.strip().lower() for v in headers.getall("Connection", []) for t in v.split(",")}
    for key in out:
        lk = key.lower()
        assert lk not in OWNED and not lk.startswith(("mif-", "x-gateway-"))
        assert lk not in {"host", "content-length", "content-encoding", "connection", "upgrade"}
        assert lk not in connection


segments = st.sampled_from(["v1", "..", ".", "%2e%2e", "%2E%2e", "chat", "%2f", "a%5c..", ""])


@pytest.mark.slow
@FUZZ
@given(st.lists(segments | st.text(max_size=6), max_size=6), st.booleans())
def test_a_target_either_is_rejected_or_has_no_dot_dot_segment(
    parts: list[str], absolute: bool
) -> None:
    from urllib.parse import unquote

    target = ("http://h" if absolute else "") + "/" + "/".join(parts)
    _, exc = attempt(check_target, target)
    if exc is not None:
        assert exc.status == 400
        return
    assert not absolute
    path = target.partition("?")[0]  # a ".." in the query string is not a path segment
    assert ".." not in unquote(path).replace("\\", "/").split("/")


events = st.recursive(
    st.none() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.binary(max_size=16)
    | st.text(max_size=12) | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=10), inner, max_size=6),
    max_leaves=20,
)  # fmt: skip


@pytest.mark.slow
@FUZZ
@given(st.one_of(st.binary(max_size=128), events.map(lambda e: msgpack.packb(e))))
def test_kv_event_payloads_decode_or_fail_with_a_decode_error(payload: bytes) -> None:
    with contextlib.suppress(EventDecodeError):
        decode_batch(payload)


@pytest.mark.slow
@FUZZ
@given(st.lists(events, max_size=6), st.floats(allow_nan=False, allow_infinity=False))
def test_well_framed_batches_of_garbage_events_never_crash_the_decoder(
    evs: list[Any], ts: float
) -> None:
    with contextlib.suppress(EventDecodeError):
        decode_batch(msgpack.packb([ts, evs, 0]))
