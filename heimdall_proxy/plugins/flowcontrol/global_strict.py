"""global-strict-fairness-policy: the band behaves as one queue; the flow whose head request
is best by the ordering policy (the oldest, with FCFS) goes next, whatever its fairness id.
llm-d's default: the least surprising order, but one busy tenant can fill the band."""

from __future__ import annotations

from collections.abc import Sequence

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.flowcontrol import FlowHead
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register

GLOBAL_STRICT_TYPE = "global-strict-fairness-policy"


@register(GLOBAL_STRICT_TYPE)
class GlobalStrictFairness(BasePlugin[NoParams]):
    type = GLOBAL_STRICT_TYPE

    def pick_flow(self, flows: Sequence[FlowHead], last: str | None) -> int:
        return min(range(len(flows)), key=lambda i: flows[i][1])
