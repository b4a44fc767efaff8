"""fcfs-ordering-policy: a flow's requests leave in arrival order."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register

FCFS_TYPE = "fcfs-ordering-policy"


@register(FCFS_TYPE)
class FCFSOrdering(BasePlugin[NoParams]):
    type = FCFS_TYPE

    def order_key(self, arrival: float, deadline: float) -> float:
        return arrival
