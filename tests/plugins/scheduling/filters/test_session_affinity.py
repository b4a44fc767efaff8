"""session-affinity-filter: a session pinned to its pod, as a hard constraint, by either
strategy; the session-id-producer's datum read through a source."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    ProfileResult,
    RequestContext,
    SchedulingResult,
)
from heimdall_proxy.plugins.requestcontrol.producers.session_id import (
    SessionIDProducer,
    SessionIDProducerParams,
)
from heimdall_proxy.plugins.scheduling.filters.session_affinity import SessionAffinityFilter
from heimdall_proxy.plugins.scheduling.session_affinity import (
    SessionAffinityParams,
    SessionBindings,
    encode_token,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

PODS = [ep("vllm-0"), ep("vllm-1"), ep("vllm-2")]


def make(**params: Any) -> SessionAffinityFilter:
    return SessionAffinityFilter("sa", SessionAffinityParams.model_validate(params), ledger())


def names(endpoints: list[Endpoint]) -> list[str]:
    return [e.name for e in endpoints]


# ---- encoded_endpoint_header (the default) ----


def test_the_token_pins_its_pod_and_anything_else_passes_every_candidate() -> None:
    flt = make()
    pinned = flt.filter(
        CycleState(), req(headers={"x-session-token": encode_token("vllm-1")}), PODS
    )
    assert names(pinned) == ["vllm-1"]
    namespaced = req(headers={"x-session-token": encode_token("default/vllm-2")})
    assert names(flt.filter(CycleState(), namespaced, PODS)) == ["vllm-2"]
    for headers in ({}, {"x-session-token": "%%%"}, {"x-session-token": encode_token("gone")}):
        assert names(flt.filter(CycleState(), req(headers=headers), PODS)) == names(PODS)


async def test_the_answer_carries_its_pod_and_a_profile_instance_its_profiles_pick() -> None:
    result = SchedulingResult(
        {"decode": ProfileResult([PODS[0]]), "prefill": ProfileResult([PODS[2]])}, "decode"
    )
    c = RequestContext(req(), CycleState(), result, PODS[0])
    await make().response_received(c)
    await make(
        profileName="prefill",
        encodedEndpointHeaderConfig={"header": "X-Session-Token-Prefill"},
    ).response_received(c)
    assert c.response_headers == {
        "x-session-token": encode_token("vllm-0"),
        "x-session-token-prefill": encode_token("vllm-2"),
    }
    decode_only = RequestContext(
        req(),
        CycleState(),
        SchedulingResult({"decode": ProfileResult([PODS[0]])}, "decode"),
        PODS[0],
    )
    await make(profileName="prefill").response_received(decode_only)
    assert decode_only.response_headers == {}  # no prefill stage: nothing to pin


# ---- session_id ----


async def serve(
    flt: SessionAffinityFilter,
    headers: dict[str, str],
    pods: list[Endpoint],
    pick: int = 0,
    state: CycleState | None = None,
) -> str:
    """One request as the gateway runs it: filter, the picker takes `pick` of what is left,
    the attempt's pre_request hooks; the pod served."""
    state = state if state is not None else CycleState()
    request = req(headers=headers)
    left = flt.filter(state, request, pods)
    target = left[min(pick, len(left) - 1)]
    result = SchedulingResult({"default": ProfileResult([target])}, "default")
    await flt.pre_request(RequestContext(request, state, result, target))
    return target.name


async def test_a_session_stays_on_its_first_pod_and_moves_only_when_it_is_gone() -> None:
    flt = make(strategy="session_id")
    s = {"x-session-id": "conv-1"}
    assert await serve(flt, s, PODS, pick=1) == "vllm-1"  # unbound: no preference
    assert await serve(flt, s, PODS, pick=2) == "vllm-1"  # bound: only its pod is left
    assert await serve(flt, s, [PODS[0], PODS[2]], pick=1) == "vllm-2"  # gone: moves
    assert await serve(flt, s, PODS, pick=0) == "vllm-2"
    assert await serve(flt, {}, PODS, pick=0) == "vllm-0"  # no session: no preference
    assert flt.strategy.bindings.keys() == {"conv-1"}  # type: ignore[attr-defined]


async def test_sources_in_order_and_the_producers_datum() -> None:
    producer = SessionIDProducer(
        "session-id-producer",
        SessionIDProducerParams.model_validate({"cookieName": "sid"}),
        ledger(),
    )
    flt = make(
        strategy="session_id",
        sessionIdConfig={
            "sources": [
                {"header": "X-Session-ID"},
                {"attribute": "SessionIDDataKey", "producer": "session-id-producer"},
            ]
        },
    )

    async def via_cookie(pick: int) -> str:
        state = CycleState()
        headers = {"cookie": "sid=c-9"}
        await producer.produce(state, req(headers=headers), PODS)
        return await serve(flt, headers, PODS, pick=pick, state=state)

    assert await via_cookie(2) == "vllm-2"
    assert await via_cookie(0) == "vllm-2"  # the cookie's session, read through the producer
    # the header comes first: another session
    assert await serve(flt, {"x-session-id": "h", "cookie": "sid=c-9"}, PODS, pick=0) == "vllm-0"


async def test_unused_bindings_are_swept_after_the_ttl() -> None:
    flt = make(
        strategy="session_id",
        sessionIdConfig={"evictionTtlSeconds": 60, "evictionSweepSeconds": 5},
    )
    bindings = flt.strategy
    assert isinstance(bindings, SessionBindings)
    await serve(flt, {"x-session-id": "old"}, PODS, pick=1)
    await serve(flt, {"x-session-id": "kept"}, PODS, pick=1)
    bindings.bindings["old"].last_seen -= 61  # unused for longer than the TTL
    bindings.bindings["kept"].last_seen -= 50
    await serve(flt, {"x-session-id": "new"}, PODS, pick=2)
    assert "old" in bindings.bindings  # not yet: the last sweep was under 5 s ago
    bindings.sweep(time.monotonic() + 5)
    assert bindings.bindings.keys() == {"kept", "new"}


def test_defaults_and_refusals() -> None:
    p = SessionAffinityParams.model_validate(
        {"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": 0}}
    )
    cfg = p.session_id_config
    assert (cfg.eviction_ttl_seconds, cfg.eviction_sweep_seconds) == (300.0, 10.0)
    assert [s.header for s in cfg.sources] == ["x-session-id"]
    for bad in (
        {"strategy": "cookie"},
        {"sessionIdConfig": {"evictionTtlSeconds": -1}},
        {"sessionIdConfig": {"sources": [{}]}},
        {"sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]}},
    ):
        with pytest.raises(ValidationError):
            SessionAffinityParams.model_validate(bad)


async def test_a_reload_keeps_the_bindings() -> None:
    old = make(strategy="session_id")
    await serve(old, {"x-session-id": "s"}, PODS, pick=2)
    new = make(strategy="session_id")
    assert new.inherit(old, frozenset()) is None
    assert await serve(new, {"x-session-id": "s"}, PODS, pick=0) == "vllm-2"
    assert make(strategy="session_id").inherit(make(), frozenset()) is not None


async def test_agent_identity_is_a_source_as_in_llm_ds_example() -> None:
    from heimdall_proxy.plugins.requestcontrol.agent_identity import (
        AgentIdentity,
        AgentIdentityParams,
    )

    agent = AgentIdentity("agent-identity", AgentIdentityParams(), ledger())
    flt = make(
        strategy="session_id",
        sessionIdConfig={"sources": [{"header": "x-session-id"}, {"attribute": "agent-identity"}]},
    )

    async def turn(pick: int) -> str:
        headers = {"x-claude-code-session-id": "agent-7"}
        request = req(headers=headers)
        agent.request_header(request)
        state = CycleState()
        left = flt.filter(state, request, PODS)
        target = left[min(pick, len(left) - 1)]
        result = SchedulingResult({"default": ProfileResult([target])}, "default")
        await flt.pre_request(RequestContext(request, state, result, target))
        return target.name

    assert await turn(1) == "vllm-1"
    assert await turn(2) == "vllm-1"
