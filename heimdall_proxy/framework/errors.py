"""The one error type for "answer this request with an error": raised by the server's request
path and by plugins alike, rendered OpenAI-shaped by `server/errors.py`."""

from __future__ import annotations

from collections.abc import Mapping

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class RequestError(Exception):
    """Stop a request and answer it with `{"error": {"message", "type", "param", "code"}}` and
    `status`, e.g. a 404 for a `previous_response_id` that names no stored response.

    Prepare-data plugins otherwise fail open (any other exception is logged and the request
    goes on without their data); this one is let through. `type` defaults to
    "invalid_request_error" below 500 and "server_error" from 500 on."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or (INVALID_REQUEST if status < 500 else SERVER_ERROR)
        self.headers = dict(headers or {})
