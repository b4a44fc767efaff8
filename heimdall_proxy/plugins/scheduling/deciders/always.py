"""always-disagg-pd-decider and always-disagg-multimodal-decider."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.disagg import is_multimodal
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

ALWAYS_DISAGG_PD_DECIDER_TYPE = "always-disagg-pd-decider"
ALWAYS_DISAGG_MULTIMODAL_DECIDER_TYPE = "always-disagg-multimodal-decider"


@register(ALWAYS_DISAGG_PD_DECIDER_TYPE)
class AlwaysDisaggPDDecider(BasePlugin[NoParams]):
    """Prefill decider: every request runs prefill on a prefill pod."""

    type = ALWAYS_DISAGG_PD_DECIDER_TYPE

    def decide(self, state: CycleState, request: InferenceRequest, decode: Endpoint) -> bool:
        return True


@register(ALWAYS_DISAGG_MULTIMODAL_DECIDER_TYPE)
class AlwaysDisaggMultimodalDecider(BasePlugin[NoParams]):
    """Encode decider: runs encode when the request holds an image, audio or video part
    (chat messages' content parts, or Responses input items and their content)."""

    type = ALWAYS_DISAGG_MULTIMODAL_DECIDER_TYPE

    def decide(self, state: CycleState, request: InferenceRequest, decode: Endpoint) -> bool:
        return is_multimodal(request.api, request.data)
