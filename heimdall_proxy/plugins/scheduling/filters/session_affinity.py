"""session-affinity-filter: pins a session to the pod that served it, as a hard constraint."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.plugins.scheduling.session_affinity import (
    SessionAffinityParams,
    inherit_bindings,
    make_strategy,
)

SESSION_AFFINITY_FILTER_TYPE = "session-affinity-filter"


@register(SESSION_AFFINITY_FILTER_TYPE, SessionAffinityParams)
class SessionAffinityFilter(BasePlugin[SessionAffinityParams]):
    """When the session's pod is a candidate, it is the only one left; otherwise (no
    session, an unknown one, or its pod gone) every candidate passes and the other plugins
    place the request: it never empties the list. The session's pod comes from `strategy`
    (plugins/scheduling/session_affinity.py): `encoded_endpoint_header` (the default: the
    token the client echoes in `encodedEndpointHeaderConfig.header`, which each answer
    carries) or `session_id` (the client's own id, read from `sessionIdConfig.sources`, whose
    pod is remembered). With `profileName` it pins that profile's pick (e.g. prefill, with
    its own header), else the pod that answers.

    The session-affinity-scorer does the same as a preference that other scorers can
    outweigh; configure one or the other (with session_id their memories are apart)."""

    type = SESSION_AFFINITY_FILTER_TYPE

    def __init__(self, name: str, params: SessionAffinityParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.strategy = make_strategy(params, name)

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        target = self.strategy.choose(state, request, endpoints)
        return [target] if target is not None else endpoints

    async def pre_request(self, ctx: RequestContext) -> None:
        self.strategy.bind(ctx)

    async def response_received(self, ctx: RequestContext) -> None:
        self.strategy.respond(ctx)

    def inherit(self, previous: object, gone: frozenset[str]) -> str | None:
        return inherit_bindings(self.strategy, previous)
