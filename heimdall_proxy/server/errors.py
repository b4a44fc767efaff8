"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web

from heimdall_proxy.framework.errors import RequestError

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class GatewayError(Exception):
    """An error the gateway answers itself."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or (INVALID_REQUEST if status < 500 else SERVER_ERROR)
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    @classmethod
    def from_request_error(cls, exc: RequestError) -> GatewayError:
        """The server-side twin of an error a plugin raised to answer the client."""
        return cls(
            exc.status,
            exc.message,
            type=exc.type,
            code=exc.code,
            param=exc.param,
            headers=exc.headers,
        )

    def response(self) -> web.Response:
        return error_response(
            self.status,
            self.message,
            type=self.type,
            code=self.code,
            param=self.param,
            headers=self.headers,
        )


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
