"""agent-identity: the coding agents' session headers, in llm-d's order after the operator's
own, as the request's agent identity; flow control takes it as the fairness id when no
fairness header names one."""

from __future__ import annotations

import pytest

from heimdall_proxy.config.flow import ObjectiveConfig
from heimdall_proxy.flowcontrol.objectives import DEFAULT_FLOW, Objectives
from heimdall_proxy.plugins.requestcontrol.agent_identity import (
    AgentIdentity,
    AgentIdentityParams,
)
from tests.plugins.helpers import ledger, req


def identity(headers: dict[str, str], extra: list[str] | None = None) -> str:
    plugin = AgentIdentity(
        "ai", AgentIdentityParams(additionalSessionHeaders=extra or []), ledger()
    )
    r = req(headers=headers)
    plugin.request_header(r)
    return r.agent_identity


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        ({"x-claude-code-session-id": "cc-1"}, "cc-1"),
        ({"x-session-affinity": "oc-1"}, "oc-1"),
        ({"session-id": "cx-1"}, "cx-1"),
        ({"session_id": "cx-old"}, "cx-old"),
        # first in llm-d's order wins
        ({"session_id": "cx-old", "x-session-affinity": "oc-1"}, "oc-1"),
        ({"session-id": "cx-1", "x-claude-code-session-id": "cc-1"}, "cc-1"),
        ({"x-claude-code-session-id": "", "session-id": "cx-1"}, "cx-1"),  # empty: skipped
        ({"x-other": "z"}, ""),
    ],
)
def test_the_built_in_headers(headers: dict[str, str], want: str) -> None:
    assert identity(headers) == want


def test_the_operators_headers_come_first_lowercased() -> None:
    headers = {"x-my-agent-session": "mine", "x-claude-code-session-id": "cc-1"}
    assert identity(headers, ["X-My-Agent-Session"]) == "mine"
    assert identity({"x-claude-code-session-id": "cc-1"}, ["x-my-agent-session"]) == "cc-1"


def classify(headers: dict[str, str], agent: str = "") -> str:
    r = req(headers=headers)
    r.agent_identity = agent
    Objectives([ObjectiveConfig(name="gold", priority=1)]).classify(r)
    return r.fairness_id


def test_the_fairness_id_explicit_header_then_agent_then_default() -> None:
    assert classify({"x-llm-d-inference-fairness-id": "t1"}, "cc-1") == "t1"
    assert classify({"x-gateway-inference-fairness-id": "t2"}, "cc-1") == "t2"
    both = {"x-llm-d-inference-fairness-id": "new", "x-gateway-inference-fairness-id": "old"}
    assert classify(both) == "new"
    assert classify({}, "cc-1") == "cc-1"
    assert classify({}) == DEFAULT_FLOW
