"""The client: a pool of idle keep-alive connections per pod origin, and the answer of one
request, read whole (`read`) or as it arrives (`readany`)."""

from __future__ import annotations

import asyncio
import base64
import math
import ssl
from collections.abc import Callable, Mapping
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from multidict import CIMultiDict

from heimdall_proxy.upstream.connection import Connection
from heimdall_proxy.upstream.errors import (
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamError,
    UpstreamTimeout,
)

#: Methods a request may be sent twice with (RFC 9110 section 9.2.2), as aiohttp's client.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
#: Pod origins remembered (parsed once each); beyond this the memory starts over, so a
#: fleet whose pods come and go does not grow it without end.
MAX_ORIGINS = 4096


class UpstreamTimeouts(NamedTuple):
    """Time limits of one request, in seconds (None or 0: none, as in aiohttp)."""

    #: Longest silence of the pod: until its answer's head, and between body chunks.
    read: float | None = None
    #: The whole exchange, the connect included.
    total: float | None = None


NO_LIMITS = UpstreamTimeouts()
#: Seconds an idle connection is kept: shorter than uvicorn's 5 s (vLLM's idle limit), so a
#: pooled connection is not one the pod is closing.
KEEPALIVE = 4.0


class _Origin:
    """Where one pod origin (`scheme://host:port`) is reached, parsed once."""

    __slots__ = ("auth", "host", "port", "prefix", "request_line_tail", "ssl")

    def __init__(self, origin: str, tls: Callable[[], ssl.SSLContext]) -> None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) origin: {origin!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = tls() if parts.scheme == "https" else None
        #: A path the pod is served under (`http://host:port/vllm`), before every target.
        self.prefix = parts.path.rstrip("/")
        #: Basic credentials of the URL (`http://user:pass@host`), as aiohttp sends them.
        self.auth = ""
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = self.port == (443 if self.ssl else 80)
        #: What follows the request target on the first line: the version and Host.
        self.request_line_tail = (
            f" HTTP/1.1\r\nHost: {host if default else f'{host}:{self.port}'}\r\n"
        )


class UpstreamClient:
    """Connections to the pods, kept open between requests for `keepalive` seconds (shorter
    than the pod's own idle limit, uvicorn's 5 s for vLLM, so a pooled connection is not one
    the pod is closing). No limit on how many are open: the gateway's own admission bounds
    the requests in flight."""

    def __init__(self, connect_timeout: float | None = 5.0, keepalive: float = KEEPALIVE) -> None:
        self.connect_timeout = connect_timeout or None
        self.keepalive = keepalive
        self._origins: dict[str, _Origin] = {}
        #: Idle connections per origin, the most recently used last.
        self._idle: dict[str, list[Connection]] = {}
        self._open: set[Connection] = set()
        self._tls: ssl.SSLContext | None = None
        #: When idle connections past their keep-alive are next closed (a pod that left the
        #: fleet without closing its connections is never asked for one again).
        self._next_sweep = 0.0
        self.closed = False

    async def request(
        self,
        method: str,
        origin: str,
        target: str,
        body: bytes,
        headers: Mapping[str, str],
        timeouts: UpstreamTimeouts = NO_LIMITS,
    ) -> UpstreamResponse:
        """Send `method target` with `body` and `headers` (Host and Content-Length are set
        here) to `origin` (`http://host:port`) and return once the answer's head arrived.

        Raises UpstreamError (UpstreamTimeout is also a TimeoutError) when no answer head
        came, ValueError for a header that would split the request."""
        if self.closed:
            raise UpstreamConnectError("the upstream client is closed")
        where = self._origins.get(origin) or self._origin(origin)
        loop = asyncio.get_running_loop()
        read, total = timeouts
        deadline = loop.time() + total if total else None
        head = _head(method, target, where, headers, len(body))
        read = read or None
        conn = self._pooled(origin, loop.time())
        fresh = conn is None
        if conn is None:
            conn = await self._connect(loop, origin, where, deadline)
        while True:
            conn.send(head, body, method == "HEAD")
            response = UpstreamResponse(conn, self, read, deadline)
            try:
                while conn.headers is None:
                    await conn.wait(response._wait_limit())
            except UpstreamDisconnected:
                conn.close()
                if fresh or conn.received or method not in IDEMPOTENT:
                    raise
                # The pod closed the pooled connection, and may or may not have seen the
                # request: only a request that may run twice is sent again. (A POST fails
                # here, and the relay tries it on the next pod, within its attempts.)
                fresh = True
                conn = await self._connect(loop, origin, where, deadline)
                continue
            except BaseException:
                conn.close()
                raise
            response._started()
            return response

    async def fetch(
        self,
        method: str,
        origin: str,
        target: str,
        body: bytes,
        headers: Mapping[str, str],
        timeouts: UpstreamTimeouts = NO_LIMITS,
    ) -> tuple[int, bytes]:
        """`request`, its answer read whole: (status, body); the connection is pooled again."""
        resp = await self.request(method, origin, target, body, headers, timeouts)
        try:
            payload = await resp.read()
        except BaseException:
            resp.close()
            raise
        resp.release()
        return resp.status, payload

    def _origin(self, origin: str) -> _Origin:
        if len(self._origins) >= MAX_ORIGINS:
            self._origins.clear()
        try:
            where = self._origins[origin] = _Origin(origin, self._tls_context)
        except ssl.SSLError as exc:  # the machine's CA store could not be loaded
            raise UpstreamConnectError(f"no TLS context for {origin}: {exc}") from exc
        return where

    def _tls_context(self) -> ssl.SSLContext:
        """One verifying context for every https pod (loading the CA store takes ~50 ms)."""
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _pooled(self, origin: str, now: float) -> Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < self.keepalive:
                return conn
            conn.close()
        return None

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, origin: str, where: _Origin, deadline: float | None
    ) -> Connection:
        limit = self.connect_timeout
        if deadline is not None:
            left = deadline - loop.time()
            limit = left if limit is None else min(limit, left)
        try:
            async with asyncio.timeout(limit):
                _, conn = await loop.create_connection(
                    lambda: Connection(loop, origin, self._lost),
                    where.host,
                    where.port,
                    ssl=where.ssl,
                )
        except TimeoutError:
            raise UpstreamTimeout(
                f"connect to {where.host}:{where.port} timed out after {limit}s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(
                f"cannot connect to {where.host}:{where.port}: {exc}"
            ) from exc
        if self.closed:
            conn.close()
            raise UpstreamConnectError("the upstream client is closed")
        self._open.add(conn)
        return conn

    def _release(self, conn: Connection) -> None:
        """Pool a connection whose answer was read to the end, or close it."""
        if conn.complete and conn.keep_alive and not conn.lost and not self.closed:
            conn.active = False
            if conn.paused:  # the answer's last bytes filled the buffer: read again (an
                conn.paused = False  # idle connection must see the pod close it)
                assert conn.transport is not None
                conn.transport.resume_reading()
            idle = self._idle.get(conn.origin)
            if idle is None:
                idle = self._idle[conn.origin] = []
            idle.append(conn)
            if conn.idle_since >= self._next_sweep:
                self._sweep(conn.idle_since)
        else:
            conn.close()

    def _sweep(self, now: float) -> None:
        """Close the idle connections past their keep-alive, and forget origins left with
        none; at most once per keep-alive period."""
        self._next_sweep = now + self.keepalive
        for origin, idle in list(self._idle.items()):
            keep = []
            for conn in idle:
                if now - conn.idle_since < self.keepalive:
                    keep.append(conn)
                else:
                    conn.close()
            if keep:
                self._idle[origin] = keep
            else:
                del self._idle[origin]

    def _lost(self, conn: Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        """Close every connection; requests still reading fail with UpstreamDisconnected."""
        self.closed = True
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their connection_lost


class UpstreamResponse:
    """A pod's answer: status and headers at once, the body read whole or as it arrives.
    Call `release` after reading it to the end (the connection goes back to the pool), or
    `close` to give the connection up."""

    __slots__ = ("_client", "_conn", "_deadline", "_read", "content_length", "headers", "reason",
                 "status")  # fmt: skip

    # Set by `_started`, once the head arrived: the client hands the answer out only then.
    status: int
    reason: str
    headers: CIMultiDict[str]
    content_length: int | None

    def __init__(
        self,
        conn: Connection,
        client: UpstreamClient,
        read: float | None,
        deadline: float | None,
    ) -> None:
        self._conn = conn
        self._client = client
        self._read = read
        self._deadline = deadline

    def _started(self) -> None:
        conn = self._conn
        self.status = conn.status
        self.reason = conn.reason
        assert conn.headers is not None
        self.headers = conn.headers
        length = conn.headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None

    def _wait_limit(self) -> float | None:
        """Before each wait: raises the connection's failure, or else says how long the
        wait may last (the read limit, cut to what the total leaves)."""
        conn = self._conn
        if conn.error is not None:
            raise conn.error
        if conn.lost:
            raise UpstreamDisconnected("the connection was closed before the answer's end")
        return self._read if self._deadline is None else self._left()

    def _left(self) -> float | None:
        """`_wait_limit` with a total: raises once it ran out."""
        assert self._deadline is not None
        left = self._deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise UpstreamTimeout("the request's total time limit ran out")
        return left if self._read is None else min(self._read, left)

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at the
        end. Raises UpstreamError when the pod fails or falls silent before the end."""
        conn = self._conn
        while True:
            if conn.chunks:
                if self._deadline is not None:
                    self._left()  # raises once the total ran out, data buffered or not
                return conn.take()
            if conn.complete:
                return b""
            await conn.wait(self._wait_limit())

    async def read(self) -> bytes:
        """The whole body. Raises UpstreamError when the pod fails or falls silent first."""
        conn = self._conn
        conn.pause_at = math.inf  # it is all kept anyway
        while not conn.complete:
            await conn.wait(self._wait_limit())
        return conn.take()

    def release(self) -> None:
        self._client._release(self._conn)

    def close(self) -> None:
        self._conn.close()


def _head(
    method: str, target: str, where: _Origin, headers: Mapping[str, str], length: int
) -> bytes:
    """The request's head. Content-Length always for a body, and for a POST or PUT without
    one; never for a GET or HEAD without one (as browsers and aiohttp do)."""
    fields = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    count = len(headers)
    if fields.count("\n") != count or fields.count("\r") != count:
        raise ValueError("a request header contains a line break")
    if "\n" in target or "\r" in target:
        raise ValueError("the request target contains a line break")
    if where.auth and "Authorization" not in headers:
        fields += f"Authorization: {where.auth}\r\n"
    if length or method not in ("GET", "HEAD"):
        fields += f"Content-Length: {length}\r\n"
    return f"{method} {where.prefix}{target}{where.request_line_tail}{fields}\r\n".encode(
        "utf-8", "surrogateescape"
    )


__all__ = ["UpstreamClient", "UpstreamError", "UpstreamResponse", "UpstreamTimeouts"]
