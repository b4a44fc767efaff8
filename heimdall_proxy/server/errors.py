"""Error bodies in the shape of the request's API: OpenAI's
{"error": {"message", "type", "param", "code"}}, or Anthropic's
{"type": "error", "error": {"type", "message"}} on the Messages API's paths. Only renders;
the error itself is `framework.errors.RequestError`."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web

from heimdall_proxy.framework.errors import INVALID_REQUEST, SERVER_ERROR, RequestError


def error_body(
    message: str,
    *,
    type: str,
    code: str | None = None,
    param: str | None = None,
) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def error_response(
    status: int,
    message: str,
    *,
    type: str | None = None,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    body = error_body(
        message,
        type=type or (INVALID_REQUEST if status < 500 else SERVER_ERROR),
        code=code,
        param=param,
    )
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


#: Anthropic's error types by status (its API reference); others by class of status.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    """Whether `path` is one of the Messages API's, whose clients read Anthropic's errors."""
    return path.rstrip("/").endswith(("/messages", "/messages/count_tokens"))


def anthropic_error_body(status: int, message: str) -> bytes:
    kind = ANTHROPIC_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def render(exc: RequestError, path: str = "") -> web.Response:
    """The HTTP answer for a RequestError, shaped as the API of `path` answers errors."""
    if path and is_anthropic_path(path):
        return web.Response(
            status=exc.status,
            body=anthropic_error_body(exc.status, exc.message),
            content_type="application/json",
            headers=exc.headers,
        )
    return error_response(
        exc.status,
        exc.message,
        type=exc.type,
        code=exc.code,
        param=exc.param,
        headers=exc.headers,
    )
