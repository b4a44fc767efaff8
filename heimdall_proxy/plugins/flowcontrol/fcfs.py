"""fcfs-ordering-policy: a flow's requests leave in arrival order."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import InferenceRequest

FCFS_TYPE = "fcfs-ordering-policy"


@register(FCFS_TYPE)
class FCFSOrdering(BasePlugin[NoParams]):
    type = FCFS_TYPE

    def order_key(self, arrival: float, deadline: float, request: InferenceRequest) -> float:
        return arrival
