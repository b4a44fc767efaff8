"""session-affinity-scorer: prefers the pod that served a session before."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.plugins.scheduling.session_affinity import (
    SESSION_HEADER,
    SessionAffinityParams,
    decode_token,
    encode_token,
    inherit_bindings,
    make_strategy,
)

SESSION_AFFINITY_SCORER_TYPE = "session-affinity-scorer"

__all__ = [
    "SESSION_AFFINITY_SCORER_TYPE",
    "SESSION_HEADER",
    "SessionAffinityScorer",
    "decode_token",
    "encode_token",
]


@register(SESSION_AFFINITY_SCORER_TYPE, SessionAffinityParams)
class SessionAffinityScorer(BasePlugin[SessionAffinityParams]):
    """The session's pod scores 1.0, every other 0.0; no session, an unknown one, or one
    whose pod is not a candidate scores 0.0 everywhere. The session's pod comes from
    `strategy` (plugins/scheduling/session_affinity.py):

    - `encoded_endpoint_header` (the default): the request's `x-session-token`
      (`encodedEndpointHeaderConfig.header`) is base64 of a pod name; every answer carries
      its own pod's token there. A token that is not valid base64, or names no candidate, is
      ignored; `namespace/name` tokens, as llm-d issues them, match the pod `name`.
    - `session_id`: the client's own session id, read from `sessionIdConfig.sources` (a
      header, or an attribute such as session-id-producer's), whose pod is remembered for
      `evictionTtlSeconds` after its last use; nothing is written back.

    With `profileName` it pins that profile's pick, else the pod that answers."""

    type = SESSION_AFFINITY_SCORER_TYPE

    def __init__(self, name: str, params: SessionAffinityParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.strategy = make_strategy(params, name)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        target = self.strategy.choose(state, request, endpoints)
        return DefaultScores(endpoints, 0.0, {target.name: 1.0} if target is not None else {})

    async def pre_request(self, ctx: RequestContext) -> None:
        self.strategy.bind(ctx)

    async def response_received(self, ctx: RequestContext) -> None:
        self.strategy.respond(ctx)

    def inherit(self, previous: object, gone: frozenset[str]) -> str | None:
        return inherit_bindings(self.strategy, previous)
