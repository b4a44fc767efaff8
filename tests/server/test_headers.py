"""Header filtering in both directions, with and without a Connection header: the filters
skip the Connection scan when a message has none (the usual keep-alive message), and the
result must be the same as the full rule gives."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from heimdall_proxy.server.headers import client_response_headers, upstream_request_headers


def _proxy(pairs: list[tuple[str, str]]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_response_headers_without_connection_drop_framing_and_keep_the_rest_in_order() -> None:
    upstream = _proxy(
        [
            ("Content-Type", "application/json"),
            ("Content-Length", "420"),
            ("Set-Cookie", "a=1"),
            ("Transfer-Encoding", "chunked"),
            ("Set-Cookie", "b=2"),
            ("X-Request-Id", "r1"),
        ]
    )
    out = client_response_headers(upstream)
    assert list(out.items()) == [
        ("Content-Type", "application/json"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
        ("X-Request-Id", "r1"),
    ]


def test_response_headers_listed_in_connection_are_dropped() -> None:
    upstream = _proxy(
        [
            ("Connection", "keep-alive, X-Hop"),
            ("connection", "x-other"),
            ("X-Hop", "1"),
            ("X-Other", "2"),
            ("Keep-Alive", "timeout=5"),
            ("X-Kept", "3"),
        ]
    )
    assert list(client_response_headers(upstream).items()) == [("X-Kept", "3")]


def test_request_headers_without_connection_drop_owned_and_framing() -> None:
    client = _proxy(
        [
            ("Host", "gw"),
            ("Content-Length", "10"),
            ("Content-Encoding", "gzip"),
            ("Expect", "100-continue"),
            ("X-Gateway-Destination-Endpoint", "10.0.0.1:8000"),
            ("mif-prefill-endpoint", "p"),
            ("X-Decoder-Host-Port", "d:1"),
            ("Authorization", "Bearer k"),
            ("Content-Type", "application/json"),
        ]
    )
    assert list(upstream_request_headers(client).items()) == [
        ("Authorization", "Bearer k"),
        ("Content-Type", "application/json"),
    ]


def test_request_headers_listed_in_connection_are_dropped() -> None:
    client = _proxy([("Connection", "X-Secret"), ("X-Secret", "s"), ("X-Kept", "k")])
    assert list(upstream_request_headers(client).items()) == [("X-Kept", "k")]
