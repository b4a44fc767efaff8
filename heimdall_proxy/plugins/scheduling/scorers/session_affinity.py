"""session-affinity-scorer: keeps a session on the pod that served it before."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
)

SESSION_AFFINITY_SCORER_TYPE = "session-affinity-scorer"
SESSION_HEADER = "x-session-token"


def encode_token(pod_name: str) -> str:
    return base64.b64encode(pod_name.encode()).decode("ascii")


def decode_token(token: str) -> str | None:
    """The pod name in a token, or None when the token is not base64 of UTF-8 text."""
    try:
        return base64.b64decode(token.strip(), validate=True).decode()
    except (binascii.Error, ValueError):
        return None


@register(SESSION_AFFINITY_SCORER_TYPE)
class SessionAffinityScorer(BasePlugin[NoParams]):
    """Request: decodes `x-session-token` (base64 of a pod name); the candidate of that name
    scores 1.0, every other 0.0. A token that is not valid base64, or names no candidate, is
    ignored (all 0.0): it only ever selects among the candidates, so it can never make the
    gateway dial an address a client chose. Tokens of the form `namespace/name`, as llm-d
    issues them, match the pod `name`.

    Response: sets `x-session-token` to base64 of the serving pod's name on every response."""

    type = SESSION_AFFINITY_SCORER_TYPE

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        token = request.session_token
        pod = decode_token(token) if token else None
        if pod is not None:
            names = {e.name for e in endpoints}
            if pod not in names and "/" in pod:
                pod = pod.rsplit("/", 1)[1]
        return {e.name: 1.0 if e.name == pod else 0.0 for e in endpoints}

    async def response_received(self, ctx: RequestContext) -> None:
        ctx.response_headers[SESSION_HEADER] = encode_token(ctx.target.name)
