"""round-robin-fairness-policy: the band's flows (fairness ids) take turns, in sorted id
order after the one served last, so no tenant starves another however much it sends."""

from __future__ import annotations

from collections.abc import Sequence

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.flowcontrol import FlowHead
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register

ROUND_ROBIN_TYPE = "round-robin-fairness-policy"


@register(ROUND_ROBIN_TYPE)
class RoundRobinFairness(BasePlugin[NoParams]):
    type = ROUND_ROBIN_TYPE

    def pick_flow(self, flows: Sequence[FlowHead], last: str | None) -> int:
        order = sorted(range(len(flows)), key=lambda i: flows[i][0])
        if last is None:
            return order[0]
        for i in order:
            if flows[i][0] > last:
                return i
        return order[0]
