"""agent-identity: puts every turn of a coding agent's session in one fairness flow.

Coding agents send a session id of their own on every request (Claude Code
`x-claude-code-session-id`, OpenCode `x-session-affinity`, Codex `session-id`, older Codex
`session_id`). This request-header plugin takes the first one set, after the operator's
`additionalSessionHeaders`, as the request's agent identity; flow control then uses it as
the fairness id when the client names none in `x-llm-d-inference-fairness-id` (or GIE's
`x-gateway-inference-fairness-id`), so one busy session cannot crowd out the others. A
request with none of the headers keeps the shared default flow."""

from __future__ import annotations

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import InferenceRequest

AGENT_IDENTITY_TYPE = "agent-identity"
#: The agents' own session headers, in the order llm-d checks them.
SESSION_HEADERS = ("x-claude-code-session-id", "x-session-affinity", "session-id", "session_id")


class AgentIdentityParams(PluginParams):
    #: More session headers, checked before the built-in ones, in this order (a new agent,
    #: or an agent's renamed header, without waiting for a release).
    additional_session_headers: list[str] = Field(default_factory=list)


@register(AGENT_IDENTITY_TYPE, AgentIdentityParams)
class AgentIdentity(BasePlugin[AgentIdentityParams]):
    """RequestHeader. Stateless; the header names are lowercased once (headers from tests
    and other callers may be plain dicts with lowercase keys)."""

    type = AGENT_IDENTITY_TYPE

    def __init__(self, name: str, params: AgentIdentityParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        extra = [h.lower() for h in params.additional_session_headers if h]
        self.headers: tuple[str, ...] = (*extra, *SESSION_HEADERS)

    def request_header(self, request: InferenceRequest) -> None:
        headers = request.headers
        for name in self.headers:
            value = headers.get(name)
            if value:
                request.agent_identity = value
                return
