"""response-header-handler."""

from __future__ import annotations

from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.plugins import ResponseReceived, extension_points
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    RequestContext,
    SchedulingResult,
)
from heimdall_proxy.plugins.requestcontrol.response_header import (
    DECODER_HEADER,
    PREFILLER_HEADER,
    RESPONSE_HEADER_HANDLER_TYPE,
    ResponseHeaderHandler,
)
from tests.helpers import ep

REQ = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})


def ctx(target: Endpoint, prefill: Endpoint | None = None) -> RequestContext:
    result = SchedulingResult({"decode": ProfileResult([target])}, "decode")
    return RequestContext(
        request=REQ, state=CycleState(), result=result, target=target, prefill=prefill
    )


def handler() -> ResponseHeaderHandler:
    return ResponseHeaderHandler("rh", NoParams(), None)  # type: ignore[arg-type]


def test_type_and_extension_point() -> None:
    assert RESPONSE_HEADER_HANDLER_TYPE == "response-header-handler"
    assert (DECODER_HEADER, PREFILLER_HEADER) == ("x-decoder-host-port", "x-prefiller-host-port")
    h = handler()
    assert isinstance(h, ResponseReceived)
    assert extension_points(h) == ["ResponseReceived"]


async def test_decoder_header_is_target_host_port() -> None:
    c = ctx(ep("decode-0", host="10.0.0.7", port=8200))
    c.response_headers["x-other"] = "kept"
    await handler().response_received(c)
    assert c.response_headers == {"x-other": "kept", "x-decoder-host-port": "10.0.0.7:8200"}
    assert c.upstream_headers == {}


async def test_prefiller_header_only_with_prefill() -> None:
    c = ctx(
        ep("decode-0", host="10.0.0.7", port=8200),
        prefill=ep("prefill-1", host="10.0.0.9", port=8100),
    )
    await handler().response_received(c)
    assert c.response_headers == {
        "x-decoder-host-port": "10.0.0.7:8200",
        "x-prefiller-host-port": "10.0.0.9:8100",
    }


async def test_header_follows_the_current_attempt() -> None:
    first, second = ep("a", host="a.local", port=1), ep("b", host="b.local", port=2)
    c = ctx(first)
    h = handler()
    await h.response_received(c)
    c.target = second  # the server fell back to the next pod
    await h.response_received(c)
    assert c.response_headers == {"x-decoder-host-port": "b.local:2"}
