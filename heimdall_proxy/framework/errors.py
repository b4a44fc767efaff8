"""Errors a plugin raises on purpose to answer the client itself."""

from __future__ import annotations


class RequestError(Exception):
    """Raised by a prepare-data plugin to stop a request and answer it with an OpenAI-shaped
    error, e.g. a 404 for a `previous_response_id` that names no stored response.

    Prepare-data plugins otherwise fail open (any other exception is logged and the request
    goes on without their data); this one is let through, and the server renders it as
    `{"error": {"message", "type", "param", "code"}}` with `status`. `type` defaults to
    "invalid_request_error" below 500 and "server_error" from 500 on."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type
        self.headers = dict(headers or {})
