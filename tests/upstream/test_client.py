"""heimdall_proxy.upstream, the relay's HTTP/1.1 client, against real servers on 127.0.0.1:
an aiohttp app for well-formed answers, raw asyncio servers writing exact bytes for the
malformed and unusual ones."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from heimdall_proxy.upstream import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamTimeouts,
)
from heimdall_proxy.upstream.connection import HIGH_WATER
from tests.conftest import eventually

SHORT = UpstreamTimeouts(read=2.0)  # a bug that hangs fails the test instead of stalling it


# -- raw servers: exact bytes ------------------------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@dataclass
class RawServer:
    """A TCP server whose handler gets each connection's index; it closes on return."""

    server: asyncio.Server
    host: str = "127.0.0.1"
    accepted: int = 0
    #: per connection index: set once the client closed it (EOF or reset seen by the handler)
    gone: dict[int, asyncio.Event] = field(default_factory=dict)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def url(self) -> str:
        port = self.server.sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"


RawFactory = Callable[..., Awaitable[RawServer]]


@pytest.fixture
async def raw_server() -> AsyncIterator[RawFactory]:
    servers: list[RawServer] = []

    async def start(handler: Handler, host: str = "127.0.0.1") -> RawServer:
        srv: RawServer

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            index = srv.accepted
            srv.accepted += 1
            srv.gone[index] = asyncio.Event()
            srv.writers.append(writer)
            task = asyncio.current_task()
            assert task is not None
            srv.tasks.append(task)
            try:
                await handler(reader, writer, index)
            except (ConnectionError, asyncio.IncompleteReadError):
                srv.gone[index].set()
            finally:
                writer.close()

        server = await asyncio.start_server(on_connect, host, 0)
        srv = RawServer(server, host)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.server.close()
        for writer in srv.writers:
            writer.close()
        for task in srv.tasks:
            task.cancel()
        await asyncio.gather(*srv.tasks, return_exceptions=True)
        await srv.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (Content-Length framing only: that is all the client sends)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, (await reader.readexactly(length) if length else b"")


async def until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


def answer(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


async def keep_serving(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: Any = b"ok"
) -> None:
    """A well-behaved keep-alive server: one answer per request until the client closes."""
    while True:
        try:
            await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        writer.write(answer(body if isinstance(body, bytes) else b"ok"))  # a Handler: an index


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient(connect_timeout=2.0)
    yield c
    await c.close()


async def get(client: UpstreamClient, url: str, target: str = "/") -> tuple[int, bytes]:
    resp = await client.request("GET", url, target, b"", {}, SHORT)
    body = await resp.read()
    resp.release()
    return resp.status, body


async def read_all(resp: UpstreamResponse, into: list[bytes]) -> None:
    """readany until the end, keeping what arrived in `into` (it survives a failure)."""
    while data := await asyncio.wait_for(resp.readany(), 2):
        into.append(data)


# -- an aiohttp app: well-formed answers --------------------------------------------------------

PIECES = [b"one", b"two-two", b"three" * 100]
BIG_PIECES = [i.to_bytes(4, "big") * (HIGH_WATER // 4) for i in range(64)]  # 4 MiB, in order


@dataclass
class App:
    url: str
    #: the client-side address of every request's connection (one address: one connection)
    peers: list[Any] = field(default_factory=list)
    requests: list[web.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    acks: list[asyncio.Event] = field(default_factory=lambda: [asyncio.Event() for _ in PIECES])


@pytest.fixture
async def app(aiohttp_server: Any) -> App:
    state = App("")

    def seen(request: web.Request) -> None:
        assert request.transport is not None
        state.peers.append(request.transport.get_extra_info("peername"))
        state.requests.append(request)

    async def whole(request: web.Request) -> web.Response:
        seen(request)
        resp = web.Response(status=201, reason="Made It", body=b"hello world")
        resp.headers["X-Single"] = "yes"
        resp.headers.add("X-Multi", "a")
        resp.headers.add("X-Multi", "b")
        return resp

    async def echo(request: web.Request) -> web.Response:
        seen(request)
        state.bodies.append(await request.read())
        return web.Response(body=b"echoed", headers={"X-Echo": request.headers.get("X-Note", "")})

    async def stream(request: web.Request) -> web.StreamResponse:
        seen(request)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for piece, ack in zip(PIECES, state.acks, strict=True):
            await resp.write(piece)
            await ack.wait()  # the next piece only once the client has this one
        await resp.write_eof()
        return resp

    async def big(request: web.Request) -> web.StreamResponse:
        seen(request)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for piece in BIG_PIECES:
            await resp.write(piece)
        await resp.write_eof()
        return resp

    async def nocontent(request: web.Request) -> web.Response:
        seen(request)
        return web.Response(status=204)

    async def close(request: web.Request) -> web.Response:
        seen(request)
        resp = web.Response(body=b"bye")
        resp.force_close()
        return resp

    application = web.Application()
    application.router.add_get("/whole", whole)
    application.router.add_route("*", "/echo", echo)
    application.router.add_get("/stream", stream)
    application.router.add_get("/big", big)
    application.router.add_get("/nocontent", nocontent)
    application.router.add_get("/close", close)
    server = await aiohttp_server(application)
    state.url = f"http://127.0.0.1:{server.port}"
    return state


# -- 1, 2, 4, 5, 14: answers and the pool ----------------------------------------------------------


async def test_whole_answer_and_pooled_reuse(client: UpstreamClient, app: App) -> None:
    resp = await client.request("GET", app.url, "/whole", b"", {}, SHORT)
    assert (resp.status, resp.reason) == (201, "Made It")
    assert resp.headers["x-single"] == "yes"  # case-insensitive
    assert resp.headers.getall("X-MULTI") == ["a", "b"]  # repeated headers kept, in order
    assert resp.content_length == 11
    assert await resp.read() == b"hello world"
    resp.release()
    assert await get(client, app.url, "/whole") == (201, b"hello world")
    assert len(app.peers) == 2 and app.peers[0] == app.peers[1]  # one connection, reused


async def test_chunked_stream_arrives_as_sent_then_pooled(client: UpstreamClient, app: App) -> None:
    resp = await client.request("GET", app.url, "/stream", b"", {}, SHORT)
    assert resp.content_length is None
    got = []
    for ack in app.acks:
        got.append(await resp.readany())
        ack.set()
    assert got == PIECES  # one readany per chunk as written, no chunk framing leaked
    assert await resp.readany() == b""
    assert await resp.readany() == b""  # the end stays the end
    resp.release()
    assert await get(client, app.url, "/whole") == (201, b"hello world")
    assert app.peers[0] == app.peers[1]


async def test_204_has_no_body_and_is_pooled(client: UpstreamClient, app: App) -> None:
    resp = await client.request("GET", app.url, "/nocontent", b"", {}, SHORT)
    assert resp.status == 204
    assert await resp.read() == b""
    resp.release()
    assert await get(client, app.url, "/whole") == (201, b"hello world")
    assert app.peers[0] == app.peers[1]


async def test_connection_close_answer_is_not_pooled(client: UpstreamClient, app: App) -> None:
    assert await get(client, app.url, "/close") == (200, b"bye")
    assert await get(client, app.url, "/whole") == (201, b"hello world")
    assert app.peers[0] != app.peers[1]


async def test_head_completes_at_the_head_and_is_not_pooled(
    client: UpstreamClient, app: App
) -> None:
    resp = await client.request("HEAD", app.url, "/whole", b"", {}, SHORT)
    assert resp.status == 201
    assert resp.content_length == 11  # the length a GET would have, and no body follows
    assert await resp.read() == b""
    resp.release()
    # the parser still expects 11 body bytes on that connection: it must not be reused
    assert await get(client, app.url, "/whole") == (201, b"hello world")
    assert [r.method for r in app.requests] == ["HEAD", "GET"]
    assert app.peers[0] != app.peers[1]


async def test_interim_answers_are_skipped(client: UpstreamClient, raw_server: RawFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the real answer in a later packet
        writer.write(b"HTTP/1.1 200 Fine\r\nX-Real: 1\r\nContent-Length: 4\r\n\r\nbody")
        await keep_serving(reader, writer)

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {}, SHORT)
    assert (resp.status, resp.reason) == (200, "Fine")
    assert "Link" not in resp.headers  # the interim answer's headers are not the answer's
    assert resp.headers["X-Real"] == "1"
    assert await resp.read() == b"body"
    resp.release()
    assert await get(client, srv.url) == (200, b"ok")
    assert srv.accepted == 1


# -- 3: a body that ends with the connection ---------------------------------------------------


async def test_body_until_close_is_whole_and_not_pooled(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        await read_request(reader)
        if i == 0:
            writer.write(b"HTTP/1.1 200 OK\r\n\r\npart one, ")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"part two")
            return  # closing ends the body
        writer.write(answer(b"second"))
        await keep_serving(reader, writer)

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {}, SHORT)
    assert resp.content_length is None
    assert await resp.read() == b"part one, part two"
    resp.release()
    assert await get(client, srv.url) == (200, b"second")
    assert srv.accepted == 2


# -- 6: stale pooled connections -----------------------------------------------------------------


async def test_idle_connection_closed_by_the_pod_is_replaced(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        await read_request(reader)
        writer.write(answer(b"first" if i == 0 else b"again"))
        # returning closes the connection, with no "Connection: close" announced

    srv = await raw_server(handler)
    assert await get(client, srv.url) == (200, b"first")
    await asyncio.sleep(0.05)  # the close reaches the idle pooled connection
    assert await get(client, srv.url) == (200, b"again")
    assert srv.accepted == 2


@pytest.mark.parametrize("method", ["GET", "PUT"])
async def test_pooled_connection_closed_as_an_idempotent_request_goes_out_is_retried(
    client: UpstreamClient, raw_server: RawFactory, method: str
) -> None:
    """The pod closes the pooled connection on reading the next request, answering nothing:
    a request that may run twice is sent once more on a new connection."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if i == 0:
            await read_request(reader)
            writer.write(answer(b"first"))
            heads.append((await read_request(reader))[0])
            return
        heads.append((await read_request(reader))[0])
        writer.write(answer(b"retried"))
        await keep_serving(reader, writer)

    srv = await raw_server(handler)
    assert await get(client, srv.url) == (200, b"first")
    resp = await client.request(method, srv.url, "/again", b"data", {}, SHORT)
    assert await resp.read() == b"retried"
    resp.release()
    assert srv.accepted == 2
    assert len(heads) == 2 and heads[0] == heads[1]  # the same request, sent twice


async def test_pooled_connection_closed_as_a_post_goes_out_is_not_sent_again(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    """The pod read the POST (a generation, say) and closed without answering: it may have
    run it, so the client does not send it again; the caller decides (the relay tries the
    next pod within its attempts)."""
    bodies: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        bodies.append((await read_request(reader))[1])
        writer.write(answer(b"first"))
        bodies.append((await read_request(reader))[1])

    srv = await raw_server(handler)
    resp = await client.request("POST", srv.url, "/", b"A", {}, SHORT)
    assert await resp.read() == b"first"
    resp.release()
    with pytest.raises(UpstreamDisconnected):
        await client.request("POST", srv.url, "/", b"B", {}, SHORT)
    assert bodies == [b"A", b"B"]
    assert srv.accepted == 1


async def test_pooled_connection_dying_after_answer_bytes_is_not_retried(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        await read_request(reader)
        writer.write(answer(b"first"))
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Len")  # the pod saw it and started answering

    srv = await raw_server(handler)
    assert await get(client, srv.url) == (200, b"first")
    with pytest.raises(UpstreamDisconnected):
        await client.request("GET", srv.url, "/", b"", {}, SHORT)
    assert srv.accepted == 1


# -- 7: errors -----------------------------------------------------------------------------------


async def test_connect_refused(client: UpstreamClient, raw_server: RawFactory) -> None:
    srv = await raw_server(keep_serving)
    url = srv.url
    srv.server.close()  # a port that was just listening, and no longer is
    await srv.server.wait_closed()
    with pytest.raises(UpstreamConnectError) as caught:
        await client.request("GET", url, "/", b"", {}, SHORT)
    assert isinstance(caught.value, ConnectionError)


async def test_garbage_answer_is_a_protocol_error(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\nnot http at all\r\n\r\n")
        await until_eof(reader)
        srv.gone[0].set()

    srv = await raw_server(handler)
    with pytest.raises(UpstreamProtocolError):
        await client.request("GET", srv.url, "/", b"", {}, SHORT)
    await asyncio.wait_for(srv.gone[0].wait(), 1)  # and the connection is closed


@pytest.mark.parametrize("how", ["read", "readany"])
async def test_pod_closing_mid_body(
    client: UpstreamClient, raw_server: RawFactory, how: str
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {}, SHORT)
    assert resp.content_length == 100
    if how == "read":
        with pytest.raises(UpstreamDisconnected):
            await resp.read()
    else:
        received: list[bytes] = []
        with pytest.raises(UpstreamDisconnected):
            await read_all(resp, received)
        assert b"".join(received) == b"0123456789"  # what arrived, then the failure
    resp.release()


async def test_read_timeout_before_the_head(client: UpstreamClient, raw_server: RawFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        await until_eof(reader)  # never answers
        srv.gone[0].set()

    srv = await raw_server(handler)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(UpstreamTimeout) as caught:
        await asyncio.wait_for(
            client.request("GET", srv.url, "/", b"", {}, UpstreamTimeouts(read=0.2)), 2
        )
    assert isinstance(caught.value, TimeoutError)
    assert loop.time() - start >= 0.19  # the read limit, not something sooner
    await asyncio.wait_for(srv.gone[0].wait(), 1)  # the connection was given up


async def test_read_timeout_between_chunks(client: UpstreamClient, raw_server: RawFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"first"))
        await until_eof(reader)

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {}, UpstreamTimeouts(read=0.2))
    assert await resp.readany() == b"first"
    with pytest.raises(UpstreamTimeout):
        await asyncio.wait_for(resp.readany(), 2)
    resp.close()


async def test_total_limit_cuts_a_slow_stream(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(CHUNKED_HEAD)
        while True:  # a chunk every 50 ms: the read limit never runs out
            writer.write(chunk(b"tick"))
            await writer.drain()
            await asyncio.sleep(0.05)

    srv = await raw_server(handler)
    loop = asyncio.get_running_loop()
    start = loop.time()
    limits = UpstreamTimeouts(read=0.2, total=0.4)
    resp = await client.request("GET", srv.url, "/", b"", {}, limits)
    chunks: list[bytes] = []
    with pytest.raises(UpstreamTimeout):
        await read_all(resp, chunks)
    received = b"".join(chunks)
    assert loop.time() - start >= 0.39
    assert received.startswith(b"ticktick") and set(received.split(b"tick")) == {b""}
    resp.close()


# -- 8, 9: the request as sent -----------------------------------------------------------------


async def test_header_with_a_line_break_is_refused_before_sending(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            heads.append((await read_request(reader))[0])
            writer.write(answer())

    srv = await raw_server(handler)
    bad = {"X-Ok": "fine", "X-Evil": "a\r\nX-Injected: 1"}
    with pytest.raises(ValueError, match="line break"):
        await client.request("GET", srv.url, "/", b"", bad, SHORT)
    assert srv.accepted == 0  # not even a connection
    assert await get(client, srv.url) == (200, b"ok")
    with pytest.raises(ValueError, match="line break"):  # nor on a pooled connection
        await client.request("GET", srv.url, "/", b"", {"X-Evil": "a\nb"}, SHORT)
    assert await get(client, srv.url) == (200, b"ok")
    assert srv.accepted == 1
    assert len(heads) == 2 and not any(b"Evil" in h or b"Injected" in h for h in heads)
    with pytest.raises(ValueError, match="target contains a line break"):
        await client.request(
            "GET", srv.url, "/x HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /", b"", {}, SHORT
        )
    assert len(heads) == 2


async def test_request_framing_as_the_pod_sees_it(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            seen.append(await read_request(reader))
            writer.write(answer())

    srv = await raw_server(handler)
    host = srv.url.removeprefix("http://").encode()
    body = b"\x00\r\n\r\n{binary}\xff"
    for method, target, payload in [
        ("GET", "/v1/models", b""),
        ("POST", "/v1/completions?x=1&y=%2F+z", body),
        ("POST", "/empty", b""),
        ("PATCH", "/a%20b/?q", b"p"),
    ]:
        resp = await client.request(method, srv.url, target, payload, {"X-A": "1"}, SHORT)
        assert await resp.read() == b"ok"
        resp.release()
    assert seen == [
        (b"GET /v1/models HTTP/1.1\r\nHost: %s\r\nX-A: 1\r\n\r\n" % host, b""),
        (
            b"POST /v1/completions?x=1&y=%%2F+z HTTP/1.1\r\nHost: %s\r\nX-A: 1\r\n"
            b"Content-Length: %d\r\n\r\n" % (host, len(body)),
            body,
        ),
        (b"POST /empty HTTP/1.1\r\nHost: %s\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n" % host, b""),
        (
            b"PATCH /a%%20b/?q HTTP/1.1\r\nHost: %s\r\nX-A: 1\r\nContent-Length: 1\r\n\r\n" % host,
            b"p",
        ),
    ]
    assert srv.accepted == 1


async def test_host_header_of_an_ipv6_origin(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        heads.append((await read_request(reader))[0])
        writer.write(answer())

    srv = await raw_server(handler, host="::1")
    assert await get(client, srv.url) == (200, b"ok")
    port = srv.server.sockets[0].getsockname()[1]
    assert b"\r\nHost: [::1]:%d\r\n" % port in heads[0]


def test_host_header_omits_a_default_port() -> None:
    """Ports 80 and 443 cannot be listened on here: the head is checked as built (private
    helpers of client.py)."""
    from heimdall_proxy.upstream.client import _head, _Origin

    for origin, host in [
        ("http://pod.local", b"pod.local"),
        ("http://pod.local:80", b"pod.local"),
        ("https://pod.local:443", b"pod.local"),
        ("http://[fe80::1]", b"[fe80::1]"),
        ("https://pod.local:80", b"pod.local:80"),
    ]:
        assert (
            _head("GET", "/", _Origin(origin, ssl.create_default_context), {}, 0)
            == b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % host
        )


async def test_non_ascii_header_round_trip(client: UpstreamClient, app: App) -> None:
    note = "café ✓ 東京"
    resp = await client.request("POST", app.url, "/echo", b"{}", {"X-Note": note}, SHORT)
    assert app.requests[0].headers["X-Note"] == note  # sent as utf-8, read so by aiohttp
    assert resp.headers["X-Echo"] == note  # and read back as utf-8
    assert await resp.read() == b"echoed"
    resp.release()
    assert app.bodies == [b"{}"]


async def test_invalid_origin(client: UpstreamClient) -> None:
    for origin in ("ftp://pod:21", "pod:8000", "http://"):
        with pytest.raises(ValueError, match="origin"):
            await client.request("GET", origin, "/", b"", {}, SHORT)


# -- 10: cancellation ----------------------------------------------------------------------------


async def test_cancel_while_waiting_for_the_head(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    got_request = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if i == 0:
            await read_request(reader)
            got_request.set()
            await until_eof(reader)
            srv.gone[0].set()
            return
        await keep_serving(reader, writer)

    srv = await raw_server(handler)
    task = asyncio.create_task(client.request("GET", srv.url, "/", b"", {}))
    await asyncio.wait_for(got_request.wait(), 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(srv.gone[0].wait(), 1)  # the pod sees the connection go
    assert await get(client, srv.url) == (200, b"ok")
    assert srv.accepted == 2


# -- 11: flow control ----------------------------------------------------------------------------


async def test_slow_reader_pauses_the_socket(client: UpstreamClient, app: App) -> None:
    """White-box: `paused` and `buffered` of the response's connection (`_conn`) are the only
    view of the socket's read state."""
    resp = await client.request("GET", app.url, "/big", b"", {}, SHORT)
    conn = resp._conn
    await eventually(lambda: conn.paused, 2)
    await asyncio.sleep(0.05)  # not reading for a while more: nothing more is buffered
    assert conn.paused
    total = sum(map(len, BIG_PIECES))
    assert conn.buffered < total // 4  # the rest waits in the pod's socket, not here
    received = bytearray()
    while data := await resp.readany():
        received += data
    assert received == b"".join(BIG_PIECES)


async def test_connection_paused_at_its_answers_end_reads_the_next_answer(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    """The last bytes of an answer push the unread body over HIGH_WATER, so the socket is
    paused as the answer completes; the reader then takes it all without waiting again and
    releases the connection. Its next exchange must read again. White-box: `_conn` to know
    when the bytes arrived."""
    tail = asyncio.Event()
    body = b"x" * (HIGH_WATER + 10)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:-20])
        await tail.wait()
        writer.write(body[-20:])
        await keep_serving(reader, writer, b"next")

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {}, SHORT)
    conn = resp._conn
    await eventually(lambda: conn.buffered == len(body) - 20, 2)
    tail.set()
    await eventually(lambda: conn.complete, 2)
    assert conn.paused
    assert await resp.read() == body
    resp.release()
    resp = await client.request("GET", srv.url, "/", b"", {}, UpstreamTimeouts(read=0.5))
    assert await resp.read() == b"next"
    resp.release()
    assert srv.accepted == 1


# -- 12: close() ---------------------------------------------------------------------------------


async def test_close_closes_idle_connections_and_refuses_requests(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        await keep_serving(reader, writer)
        srv.gone[i].set()

    srv = await raw_server(handler)
    assert await get(client, srv.url) == (200, b"ok")
    await client.close()
    await asyncio.wait_for(srv.gone[0].wait(), 1)
    with pytest.raises(UpstreamConnectError):
        await client.request("GET", srv.url, "/", b"", {}, SHORT)
    assert srv.accepted == 1


async def test_close_fails_a_reader_waiting_mid_stream(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"first"))
        await until_eof(reader)

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {})  # no read limit: close() ends it
    assert await resp.readany() == b"first"
    reader = asyncio.create_task(resp.readany())
    await asyncio.sleep(0.02)  # the reader is waiting for the next chunk
    await client.close()
    done, _ = await asyncio.wait({reader}, timeout=1)
    if not done:
        reader.cancel()
        pytest.fail("close() left a reader waiting on a closed connection")
    with pytest.raises(UpstreamError):
        reader.result()


async def test_reading_after_close_fails(client: UpstreamClient, raw_server: RawFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"first"))
        await until_eof(reader)

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {}, SHORT)
    await client.close()
    assert await resp.readany() == b"first"  # what had arrived is still handed over
    with pytest.raises(UpstreamDisconnected):
        await resp.readany()


# -- 13: bytes nobody asked for; keep-alive expiry -----------------------------------------------


@pytest.mark.parametrize("when", ["with the answer", "while idle"])
async def test_unsolicited_bytes_retire_the_connection(
    client: UpstreamClient, raw_server: RawFactory, when: str
) -> None:
    extra = answer(b"unasked")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if i == 0:
            await read_request(reader)
            if when == "with the answer":
                writer.write(answer(b"first") + extra)
            else:
                writer.write(answer(b"first"))
                await asyncio.sleep(0.03)
                writer.write(extra)
            await until_eof(reader)
            return
        await keep_serving(reader, writer, b"second")

    srv = await raw_server(handler)
    assert await get(client, srv.url) == (200, b"first")
    await asyncio.sleep(0.1)  # the extra bytes have arrived
    assert await get(client, srv.url) == (200, b"second")
    assert srv.accepted == 2


async def test_idle_connection_past_keepalive_is_not_reused(raw_server: RawFactory) -> None:
    srv = await raw_server(keep_serving)
    client = UpstreamClient(connect_timeout=2.0, keepalive=0.1)
    try:
        assert await get(client, srv.url) == (200, b"ok")
        assert await get(client, srv.url) == (200, b"ok")
        assert srv.accepted == 1
        await asyncio.sleep(0.15)
        assert await get(client, srv.url) == (200, b"ok")
        assert srv.accepted == 2
    finally:
        await client.close()


async def test_idle_connections_past_keepalive_are_swept(raw_server: RawFactory) -> None:
    """A pod no request goes to any more (it left the fleet) still gets its idle connections
    closed: a release elsewhere, a keep-alive period later, sweeps them."""
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await keep_serving(reader, writer)
        closed.set()  # the client closed the connection

    gone = await raw_server(handler)
    other = await raw_server(keep_serving)
    client = UpstreamClient(connect_timeout=2.0, keepalive=0.1)
    try:
        assert await get(client, gone.url) == (200, b"ok")
        await asyncio.sleep(0.15)
        assert not closed.is_set()
        assert await get(client, other.url) == (200, b"ok")
        await asyncio.wait_for(closed.wait(), 2)
        assert gone.url not in client._idle  # white-box: the origin is forgotten too
    finally:
        await client.close()


async def test_total_limit_holds_while_data_is_buffered(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    """A slow reader (a slow client behind the relay) finds data waiting at every call, and
    the total limit still ends the answer."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(CHUNKED_HEAD)
        for _ in range(200):
            writer.write(chunk(b"tick"))
            await asyncio.sleep(0.01)

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {}, UpstreamTimeouts(read=2, total=0.3))

    async def slow_reader() -> None:
        for _ in range(100):
            await resp.readany()
            await asyncio.sleep(0.05)  # slower than the pod: data is always buffered

    with pytest.raises(UpstreamTimeout, match="total"):
        await slow_reader()
    resp.close()


async def test_zero_limits_mean_none(raw_server: RawFactory) -> None:
    """0 is no limit, as in aiohttp (a `--first-byte-timeout 0` must not fail every request)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        await asyncio.sleep(0.05)
        writer.write(answer(b"late"))
        await keep_serving(reader, writer)

    srv = await raw_server(handler)
    client = UpstreamClient(connect_timeout=0)
    try:
        resp = await client.request("GET", srv.url, "/", b"", {}, UpstreamTimeouts(0, 0))
        assert await resp.read() == b"late"
        resp.release()
    finally:
        await client.close()


async def test_a_path_prefix_of_the_origin_comes_before_the_target(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    """An endpoint served under a path (`http://host:port/vllm`) gets it on every request."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        heads.append((await read_request(reader))[0])
        writer.write(answer())

    srv = await raw_server(handler)
    assert await get(client, srv.url + "/vllm/", "/v1/models?x=1") == (200, b"ok")
    assert heads[0].startswith(b"GET /vllm/v1/models?x=1 HTTP/1.1\r\n")


async def test_https_origins_share_one_tls_context(client: UpstreamClient) -> None:
    """Loading the CA store takes tens of milliseconds: once per client, not per pod."""
    first = client._origin("https://a.example:8443")  # white-box: no TLS server here
    second = client._origin("https://b.example:8443")
    assert first.ssl is not None and first.ssl is second.ssl
    assert client._origin("http://c.example:8000").ssl is None


async def test_credentials_in_the_origin_are_sent_as_basic_auth(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    """`http://user:pass@host` authenticates as with aiohttp; a caller's own Authorization
    header wins."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            heads.append((await read_request(reader))[0])
            writer.write(answer())

    srv = await raw_server(handler)
    origin = srv.url.replace("http://", "http://us%40er:p%3Ass@")
    assert await get(client, origin) == (200, b"ok")
    resp = await client.request("GET", origin, "/", b"", {"Authorization": "Bearer t"}, SHORT)
    await resp.read()
    resp.release()
    assert b"\r\nAuthorization: Basic dXNAZXI6cDpzcw==\r\n" in heads[0]  # us@er:p:ss
    assert b"Basic" not in heads[1] and b"\r\nAuthorization: Bearer t\r\n" in heads[1]


@pytest.mark.slow
async def test_a_stream_longer_than_the_read_limit_is_cut_only_by_silence(
    client: UpstreamClient, raw_server: RawFactory
) -> None:
    """The read limit is the longest silence, not the stream's length: chunks every 50 ms
    for 0.5 s pass a 0.2 s limit (the one watchdog timer moves its deadline on), and the
    silence after them fails the read."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(CHUNKED_HEAD)
        for _ in range(10):
            writer.write(chunk(b"tick"))
            await asyncio.sleep(0.05)
        await asyncio.sleep(5)  # silence

    srv = await raw_server(handler)
    resp = await client.request("GET", srv.url, "/", b"", {}, UpstreamTimeouts(read=0.2))
    got: list[bytes] = []
    with pytest.raises(UpstreamTimeout):
        await read_all(resp, got)
    assert b"".join(got) == b"tick" * 10
    resp.close()
