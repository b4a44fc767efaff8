"""disagg-headers-handler (alias prefill-header-handler): names the prefill and encode pods
that served a request's earlier stages in headers of the request to the decode pod."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.disagg import (
    ENCODE_ENDPOINTS_HEADER,
    PREFILL_ENDPOINT_HEADER,
    DisaggSettings,
    read_plan,
)
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import Duration, PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint, RequestContext

DISAGG_HEADERS_HANDLER_TYPE = "disagg-headers-handler"
PREFILL_HEADER_HANDLER_TYPE = "prefill-header-handler"


class DisaggHeadersParams(PluginParams):
    prefill_profile: str = "prefill"
    encode_profile: str = "encode"
    #: Ours: `gateway` (the gateway sends the prefill and encode hops itself) or `headers`
    #: (it only writes the headers, for decode pods that run their own sidecar).
    mode: Literal["gateway", "headers"] = "gateway"
    #: Ours: the longest a prefill or encode hop may take before the request is served
    #: decode-only.
    hop_timeout: Duration = Field(default=60.0, gt=0)


@register(DISAGG_HEADERS_HANDLER_TYPE, DisaggHeadersParams, aliases=(PREFILL_HEADER_HANDLER_TYPE,))
class DisaggHeadersHandler(BasePlugin[DisaggHeadersParams]):
    """PreRequest. Sets `mif-prefill-endpoint: host:port` when a prefill stage ran and
    `mif-encode-endpoints: host:port,...` when an encode stage ran, on the request to the
    decode pod (the server removed any client-sent copies). "Ran" means: in `gateway` mode,
    the gateway's hop to that pod succeeded; in `headers` mode, the profile handler chose the
    pod (the decode pod's sidecar sends the hop). Without a disaggregation plan on the
    CycleState (another profile handler), the picks of the `prefillProfile` and
    `encodeProfile` profiles are published, as in Heimdall."""

    type = DISAGG_HEADERS_HANDLER_TYPE

    def __init__(self, name: str, params: DisaggHeadersParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._settings = DisaggSettings(params.mode, params.hop_timeout)

    @property
    def disagg_settings(self) -> DisaggSettings:
        """The disaggregation settings this plugin owns (DisaggSettingsOwner)."""
        return self._settings

    def stages(self, ctx: RequestContext) -> tuple[Endpoint | None, list[Endpoint]]:
        """The prefill pod and the encode pods whose work the decode request uses."""
        plan = read_plan(ctx.state)
        if plan is not None:
            return plan.prefill_done, plan.encode_done
        results = ctx.result.profile_results
        prefill = results.get(self.params.prefill_profile)
        encode = results.get(self.params.encode_profile)
        return (
            prefill.targets[0] if prefill is not None and prefill.targets else None,
            list(encode.targets) if encode is not None else [],
        )

    async def pre_request(self, ctx: RequestContext) -> None:
        prefill, encode = self.stages(ctx)
        if prefill is not None:
            ctx.upstream_headers[PREFILL_ENDPOINT_HEADER] = prefill.hostport
        if encode:
            ctx.upstream_headers[ENCODE_ENDPOINTS_HEADER] = ",".join(e.hostport for e in encode)
