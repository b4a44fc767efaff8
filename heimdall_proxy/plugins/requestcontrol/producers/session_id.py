"""session-id-producer: reads a request's session id from a header or a cookie, once, for the
plugins that pin sessions to pods."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.session import SESSION_ID_PRODUCER_TYPE, session_id_key
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest


class SessionIDProducerParams(PluginParams):
    """Exactly one of the two."""

    #: The request header whose value is the session id (any case).
    header_name: str = ""
    #: The cookie, in the Cookie header, whose value is the session id.
    cookie_name: str = ""

    @model_validator(mode="after")
    def _one(self) -> Self:
        header, cookie = self.header_name.strip(), self.cookie_name.strip()
        if bool(header) == bool(cookie):
            raise ValueError(
                "exactly one of headerName or cookieName must be set"
                + (", not both" if header else "")
            )
        return self


def cookie_value(header: str, name: str) -> str:
    """The value of cookie `name` in a Cookie header ("a=1; b=2"), "" when it is not there."""
    for pair in header.split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            return value
    return ""


@register(SESSION_ID_PRODUCER_TYPE, SessionIDProducerParams)
class SessionIDProducer(BasePlugin[SessionIDProducerParams]):
    """Publishes the request's session id, the value of header `headerName` (matched
    case-insensitively) or of cookie `cookieName` in its Cookie header, trimmed, on the
    CycleState under `SessionIDDataKey` and this plugin's name; the session-affinity filter
    and scorer read it when a `sessionIdConfig` source names it (`attribute:
    SessionIDDataKey`, `producer: <this plugin's name>`), whichever way the client sent it.
    A request without one gets nothing published: no session, no preference."""

    type = SESSION_ID_PRODUCER_TYPE

    def __init__(self, name: str, params: SessionIDProducerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.key = session_id_key(name)
        self._header = params.header_name.strip().lower()
        self._cookie = params.cookie_name.strip()

    def session_id(self, request: InferenceRequest) -> str:
        if self._header:
            return (request.headers.get(self._header) or "").strip()
        return cookie_value(request.headers.get("cookie") or "", self._cookie).strip()

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        session = self.session_id(request)
        if session:
            state[self.key] = session
