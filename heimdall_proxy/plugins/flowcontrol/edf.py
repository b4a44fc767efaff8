"""edf-ordering-policy: earliest deadline first. A flow's request whose queue-wait budget runs
out soonest leaves first, so that fewer requests expire in the queue; a request without a
budget (defaultRequestTTL 0) sorts after every one that has one, in arrival order."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import InferenceRequest

EDF_TYPE = "edf-ordering-policy"


@register(EDF_TYPE)
class EDFOrdering(BasePlugin[NoParams]):
    """The deadline is the one the flow controller gives the request when it queues it
    (arrival + the TTL in force: defaultRequestTTL, or noEndpointRequestTTL while it has no
    candidate), inf when it has none; equal deadlines keep arrival order."""

    type = EDF_TYPE

    def order_key(self, arrival: float, deadline: float, request: InferenceRequest) -> float:
        return deadline
