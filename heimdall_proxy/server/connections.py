"""Client connections: a cap, and OpenAI-shaped answers for requests aiohttp rejects itself.

- Idle connections, and clients that trickle their headers (slowloris), are closed by
  aiohttp's keep-alive timer (`--keepalive-timeout`), which aiohttp 3.14 arms from the
  moment a connection opens and does not reset until a request's headers are complete.
  Bodies have their own limit (`--body-timeout`, in the gateway's body read).
- At most `--max-connections` are open at once: one more is answered 503 and closed once
  its client has read that (at most a second later), so a flood of idle sockets cannot
  exhaust the process's file descriptors; refusals are logged as a count every 10 s.
- A request aiohttp cannot parse (bad request line, absolute-form target, oversized
  header, ...) gets `{"error": ...}` JSON instead of aiohttp's plain-text page, and is logged
  without a traceback: it is the client's error, not the gateway's."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from heimdall_proxy.server.errors import error_response

log = logging.getLogger(__name__)

_OVER_CAP_BODY = (
    b'{"error":{"message":"Too many open connections; retry later.","type":"server_error",'
    b'"param":null,"code":"too_many_connections"}}'
)
_OVER_CAP = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
    + str(len(_OVER_CAP_BODY)).encode()
    + b"\r\n\r\n"
    + _OVER_CAP_BODY
)


#: How long a refused connection stays open for its client to read the 503 and close first
#: (closing with the request unread would reset it, and the client would see no answer).
REFUSAL_LINGER = 1.0
#: Refusals are logged once per this many seconds, with their count, not one line each.
REFUSAL_LOG_INTERVAL = 10.0


class _Count:
    __slots__ = ("last_log", "limit", "open", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        #: refusals since the last log line, and when that was
        self.refused = 0
        self.last_log = -REFUSAL_LOG_INTERVAL

    def refusal(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self.last_log >= REFUSAL_LOG_INTERVAL:
            log.warning(
                "refused %d connection(s) over --max-connections (%d open) in the last %.0fs",
                self.refused, self.limit, min(now - self.last_log, REFUSAL_LOG_INTERVAL),
            )  # fmt: skip
            self.refused = 0
            self.last_log = now


class _Refusal(asyncio.Protocol):
    """A connection over the cap: answered 503, its write side shut, whatever it sends
    discarded, and closed when the client closes or after REFUSAL_LINGER. Plain transport
    calls only, so it works on uvloop's transports as on asyncio's."""

    __slots__ = ("_timer", "_transport")

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = t = cast(asyncio.Transport, transport)
        t.write(_OVER_CAP)
        if t.can_write_eof():
            t.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER, t.close)

    def data_received(self, data: bytes) -> None:
        return None  # the request is not served: read only so that closing does not reset

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None


class GatewayRequestHandler(RequestHandler):
    """aiohttp's protocol with the cap and JSON error pages. Instances are aiohttp's own
    handlers with this class swapped in (no new slots), so aiohttp keeps building them."""

    __slots__ = ()
    count: _Count

    def connection_lost(self, exc: BaseException | None) -> None:
        self.count.open -= 1
        super().connection_lost(exc)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A body aiohttp could not decode fails again when aiohttp drains what is left of
        it after the answer (400, server/gateway.py): the client's error, not a traceback."""
        exc = kw.get("exc_info")
        if isinstance(exc, RequestPayloadError):
            log.info("dropped the rest of an undecodable request body: %s", exc)
            return
        super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            log.error("error handling a request: %r", exc)
        else:
            log.info("rejected a malformed request (%d): %s", status, message or exc)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        text = "Malformed HTTP request." if status < 500 else "Internal gateway error."
        resp = error_response(
            status, f"{text} {message}" if message and status < 500 else text,
            code="bad_request" if status < 500 else "internal_error",
        )  # fmt: skip
        resp.force_close()
        return resp


def protocol_factory(server: web.Server, max_connections: int) -> Callable[[], asyncio.Protocol]:
    """The protocol factory to serve `server` with, capped at `max_connections`."""
    count = _Count(max(1, max_connections))
    cls = type("GatewayRequestHandler", (GatewayRequestHandler,), {"__slots__": (), "count": count})

    def make() -> asyncio.Protocol:
        # Counted here, when the listener accepts, not in connection_made: a burst is
        # accepted before any of its connections is made, and must not all pass the cap.
        if count.open >= count.limit:
            count.refusal()
            return _Refusal()
        count.open += 1
        handler = server()
        handler.__class__ = cls
        return handler

    return make
