"""The relay's HTTP/1.1 client to the pods: keep-alive connections per pod, a response read
whole or chunk by chunk, connect, read and total time limits.

Why not aiohttp's client, which the rest of the gateway uses: per forwarded request it costs
more than half of a bare aiohttp forwarder's CPU (bench/RESULTS.md, "The upstream client").
This package parses with `httptools` (llhttp, the parser Node.js uses) and adds only what the
relay needs: one request at a time per connection, a body in bytes, no redirects, cookies,
proxies, compression or authentication."""

from heimdall_proxy.upstream.client import (
    KEEPALIVE,
    NO_LIMITS,
    UpstreamClient,
    UpstreamResponse,
    UpstreamTimeouts,
)
from heimdall_proxy.upstream.errors import (
    UpstreamConnectError,
    UpstreamDisconnected,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)

__all__ = [
    "KEEPALIVE",
    "NO_LIMITS",
    "UpstreamClient",
    "UpstreamConnectError",
    "UpstreamDisconnected",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamTimeouts",
]
