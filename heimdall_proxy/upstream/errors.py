"""Why an upstream request failed. Every one of these happens before the pod's answer was
complete; which of them may be retried on another pod is the relay's call (all of them may
when no response byte has reached the client yet)."""

from __future__ import annotations


class UpstreamError(ConnectionError):
    """Base class: the pod could not be reached, or its connection failed mid-answer."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened (refused, unreachable, name not resolved, TLS failed)."""


class UpstreamDisconnected(UpstreamError):
    """The pod closed the connection before its answer was complete."""


class UpstreamProtocolError(UpstreamError):
    """The pod's bytes are not a valid HTTP/1.1 response."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """A connect, read or total time limit ran out."""
