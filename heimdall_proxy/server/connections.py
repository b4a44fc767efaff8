"""Client connections: a cap, and OpenAI-shaped answers for requests aiohttp rejects itself.

- Idle connections, and clients that trickle their headers (slowloris), are closed by
  aiohttp's keep-alive timer (`--keepalive-timeout`), which aiohttp 3.14 arms from the
  moment a connection opens and does not reset until a request's headers are complete.
  Bodies have their own limit (`--body-timeout`, in the gateway's body read).
- At most `--max-connections` are open at once: one more is answered 503 and closed, so a
  flood of idle sockets cannot exhaust the process's file descriptors.
- A request aiohttp cannot parse (bad request line, absolute-form target, oversized
  header, ...) gets `{"error": ...}` JSON instead of aiohttp's plain-text page, and is logged
  without a traceback: it is the client's error, not the gateway's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

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


class _Count:
    __slots__ = ("limit", "open")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0


class GatewayRequestHandler(RequestHandler):
    """aiohttp's protocol with the cap and JSON error pages. Instances are aiohttp's own
    handlers with this class swapped in (no new slots), so aiohttp keeps building them."""

    __slots__ = ()
    count: _Count

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.count.open += 1
        if self.count.open > self.count.limit:
            log.warning("connection refused: %d open (cap %d)", self.count.open - 1,
                        self.count.limit)  # fmt: skip
            if isinstance(transport, asyncio.WriteTransport):
                transport.write(_OVER_CAP)
            transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.count.open -= 1
        super().connection_lost(exc)

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


def protocol_factory(server: web.Server, max_connections: int) -> Callable[[], RequestHandler]:
    """The protocol factory to serve `server` with, capped at `max_connections`."""
    cls = type(
        "GatewayRequestHandler",
        (GatewayRequestHandler,),
        {"__slots__": (), "count": _Count(max(1, max_connections))},
    )

    def make() -> RequestHandler:
        handler = server()
        handler.__class__ = cls
        return handler

    return make
