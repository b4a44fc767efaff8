"""response-header-handler: tells the client which pods served the request."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import RequestContext

RESPONSE_HEADER_HANDLER_TYPE = "response-header-handler"

DECODER_HEADER = "x-decoder-host-port"
PREFILLER_HEADER = "x-prefiller-host-port"


@register(RESPONSE_HEADER_HANDLER_TYPE)
class ResponseHeaderHandler(BasePlugin[NoParams]):
    """On ResponseReceived sets `x-decoder-host-port` to the serving (primary) pod's host:port,
    and `x-prefiller-host-port` to the prefill pod's when a separate prefill hop ran."""

    type = RESPONSE_HEADER_HANDLER_TYPE

    async def response_received(self, ctx: RequestContext) -> None:
        ctx.response_headers[DECODER_HEADER] = ctx.target.hostport
        if ctx.prefill is not None:
            ctx.response_headers[PREFILLER_HEADER] = ctx.prefill.hostport
