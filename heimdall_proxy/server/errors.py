"""OpenAI-shaped error bodies: {"error": {"message", "type", "param", "code"}}. Only renders;
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


def render(exc: RequestError) -> web.Response:
    """The HTTP answer for a RequestError."""
    return error_response(
        exc.status,
        exc.message,
        type=exc.type,
        code=exc.code,
        param=exc.param,
        headers=exc.headers,
    )
