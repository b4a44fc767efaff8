"""PageReader (datalayer/pages.py) against a real aiohttp server: one kept-alive connection
per pod across GETs, the session's headers sent, and every failure a scrape counts as one
raised as ValueError, OSError or TimeoutError."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from heimdall_proxy.datalayer.pages import PageReader

PAGE = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3.0\n" * 500


class _Server:
    def __init__(self) -> None:
        self.peers: set[object] = set()
        self.auth: list[str | None] = []
        self.url = ""
        self.release = asyncio.Event()

    async def metrics(self, request: web.Request) -> web.Response:
        assert request.transport is not None
        self.peers.add(request.transport.get_extra_info("peername"))
        self.auth.append(request.headers.get("Authorization"))
        return web.Response(body=PAGE, content_type="text/plain")

    async def broken(self, _: web.Request) -> web.Response:
        return web.Response(status=500, text="no")

    async def slow(self, _: web.Request) -> web.Response:
        await self.release.wait()
        return web.Response(text="late")

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(PAGE), 4096):
            await resp.write(PAGE[i : i + 4096])
        await resp.write_eof()
        return resp


@pytest.fixture
async def server() -> AsyncIterator[_Server]:
    srv = _Server()
    app = web.Application()
    app.router.add_get("/metrics", srv.metrics)
    app.router.add_get("/broken", srv.broken)
    app.router.add_get("/slow", srv.slow)
    app.router.add_get("/chunked", srv.chunked)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    srv.url = f"http://127.0.0.1:{port}"
    yield srv
    srv.release.set()
    await runner.cleanup()


async def _reader(headers: dict[str, str] | None = None) -> PageReader:
    return PageReader(aiohttp.ClientSession(headers=headers))


async def test_pages_come_over_one_kept_alive_connection_with_the_sessions_headers(
    server: _Server,
) -> None:
    reader = await _reader({"Authorization": "Bearer k"})
    try:
        for _ in range(5):
            assert await reader.get(f"{server.url}/metrics", 2.0) == PAGE
        assert await reader.get(f"{server.url}/chunked", 2.0) == PAGE
    finally:
        await reader.close()
        await reader.session.close()
    assert len(server.peers) == 1
    assert server.auth == ["Bearer k"] * 5


async def test_what_a_scrape_counts_as_failed_is_raised(server: _Server) -> None:
    reader = await _reader()
    try:
        with pytest.raises(ValueError, match="HTTP 500"):
            await reader.get(f"{server.url}/broken", 2.0)
        with pytest.raises(TimeoutError):
            await reader.get(f"{server.url}/slow", 0.1)
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        with pytest.raises(OSError, match="connect"):
            await reader.get(f"http://127.0.0.1:{free}/metrics", 2.0)
        with pytest.raises(ValueError, match="not an http"):
            await reader.get("ftp://127.0.0.1/metrics", 2.0)
        # And the connection that timed out is not reused: the next GET is answered.
        assert await reader.get(f"{server.url}/metrics", 2.0) == PAGE
    finally:
        await reader.close()
        await reader.session.close()
