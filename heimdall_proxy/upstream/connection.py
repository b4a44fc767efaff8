"""One keep-alive connection to a pod: it writes a request and parses the answer as bytes
arrive (httptools), one exchange at a time.

The answer's head (status, headers) and body chunks are handed over through one waiter
future at a time; a reader that falls behind by more than `HIGH_WATER` bytes pauses the
socket, so a slow client never makes the gateway buffer a fast pod's whole stream."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import httptools
from multidict import CIMultiDict

from heimdall_proxy.upstream.errors import (
    UpstreamDisconnected,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)

#: Unread body bytes at which the socket stops being read (resumed once they are taken).
HIGH_WATER = 1 << 16
#: Seconds a time limit may be kept early or late: uvloop's timers count whole milliseconds,
#: so a deadline compared exactly would re-arm the watchdog on every wait, or spin on it.
SLACK = 1e-3


class Connection(asyncio.Protocol):
    """The protocol of one TCP (or TLS) connection; `UpstreamResponse` reads through it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        origin: str,
        on_lost: Callable[[Connection], None],
    ) -> None:
        self.loop = loop
        #: The pod origin (`http://host:port`) whose pool the connection belongs to.
        self.origin = origin
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        #: An exchange is under way (a request written, its answer not complete).
        self.active = False
        #: The pod closed the connection, or it was closed here.
        self.lost = False
        self.idle_since = 0.0
        #: The timer that fails a wait past `expires` (see `wait`); None when not running.
        self.watchdog: asyncio.TimerHandle | None = None
        self.watchdog_at = math.inf
        self.expires = math.inf
        self._reset()

    def _reset(self) -> None:
        self.head_only = False
        #: A byte of the answer arrived (a request the pod has not seen gets none).
        self.received = False
        self.status = 0
        self.reason = ""
        self.raw_headers: list[tuple[str, str]] = []
        self.headers: CIMultiDict[str] | None = None
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.pause_at: float = HIGH_WATER

    # -- the exchange, driven by UpstreamResponse -------------------------------------------

    def send(self, head: bytes, body: bytes, head_only: bool) -> None:
        """Write one request (its head, then its body) and start reading its answer."""
        self._reset()
        self.active = True
        self.head_only = head_only
        transport = self.transport
        assert transport is not None
        if body:
            transport.writelines((head, body))
        else:
            transport.write(head)

    async def wait(self, limit: float | None) -> None:
        """Until the parser has something new (head, body bytes, the end, or a failure).
        Raises UpstreamTimeout after `limit` seconds of silence.

        The limit is kept by one watchdog timer per connection, not a timer per wait: a
        wait happens per chunk of a stream, and arming and cancelling a uvloop timer costs
        ~6.7k instructions, more than the rest of the wait. The watchdog fires at the
        earliest deadline it was set for; a wait that began since moves the deadline
        later, and the watchdog sleeps again until then."""
        if self.paused:
            self.paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        if limit:
            expires = self.expires = self.loop.time() + limit
            watchdog = self.watchdog
            if watchdog is None:
                self._arm(expires)
            elif self.watchdog_at > expires + SLACK:  # a shorter limit (the total running out)
                watchdog.cancel()
                self._arm(expires)
        else:
            self.expires = math.inf
        waiter = self.waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def _arm(self, at: float) -> None:
        self.watchdog_at = at
        self.watchdog = self.loop.call_at(at, self._watch)

    def _watch(self) -> None:
        """The watchdog: fail the wait whose deadline passed, or sleep until the current
        one; with no wait under way, stop (the next wait starts it again)."""
        self.watchdog = None
        waiter = self.waiter
        if waiter is None or waiter.done() or self.expires == math.inf:
            return
        if self.loop.time() >= self.expires - SLACK:  # uvloop's timers keep milliseconds
            waiter.set_exception(UpstreamTimeout("the pod sent nothing within the time limit"))
        else:
            self._arm(self.expires)

    def _stop_watchdog(self) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None

    def take(self) -> bytes:
        """The body bytes received and not yet taken."""
        chunks = self.chunks
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.buffered = 0
        return data

    def close(self) -> None:
        """Close the connection; a reader waiting for the answer fails at once."""
        if self.active and not self.complete:
            self._set_error(
                UpstreamDisconnected("the connection was closed before the answer's end")
            )
        self.active = False
        self._stop_watchdog()
        if not self.lost:
            self.lost = True
            if self.transport is not None:
                self.transport.close()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP or TLS transport (uvloop's is not an asyncio.Transport subclass)

    def data_received(self, data: bytes) -> None:
        if not self.active or self.complete:  # bytes nobody asked for: not to be trusted
            self.close()
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamProtocolError("the pod switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamProtocolError(f"invalid HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_watchdog()
        if self.active and not self.complete:
            if self.until_close and self.headers is not None:
                self.complete = True  # a body without length ends where the connection does
                self._wake()
            else:
                reason = f": {exc}" if exc is not None else ""
                self._fail(UpstreamDisconnected(f"the pod closed the connection{reason}"))
        self.on_lost(self)

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request: the connection is not reused
            self.keep_alive = False

    # Header bytes become text the way aiohttp reads them: utf-8, and undecodable bytes
    # survive a round trip through the client's answer.

    def on_status(self, status: bytes) -> None:
        self.reason += status.decode("utf-8", "surrogateescape")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        if self.complete:  # a second answer in the same bytes: data_received's next call
            return  # closes the connection
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer (103 Early Hints): the real one follows
            self.reason = ""
            self.raw_headers = []
            return
        self.status = status
        self.headers = headers = CIMultiDict(self.raw_headers)
        self.until_close = (
            "content-length" not in headers
            and "transfer-encoding" not in headers
            and status not in (204, 304)
        )
        if self.head_only:
            self.complete = True
            self.keep_alive = False  # the parser expects a body it will not get
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered >= self.pause_at and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status == 0 or self.complete:  # the end of an interim or an unasked answer
            self.keep_alive = False
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self.idle_since = self.loop.time()  # the pod's idle clock starts now
        self._wake()

    # -- helpers --------------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _set_error(self, error: UpstreamError) -> None:
        """The exchange failed: the first failure is the one a reader gets."""
        if self.error is None:
            self.error = error
            waiter = self.waiter
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)

    def _fail(self, error: UpstreamError) -> None:
        self._set_error(error)
        self.close()
