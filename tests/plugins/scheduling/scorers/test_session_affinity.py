"""session-affinity-scorer: base64 pod-name tokens, forged tokens ignored; or the client's
own session id, its pod remembered."""

from __future__ import annotations

import base64

from heimdall_proxy.framework.types import (
    CycleState,
    ProfileResult,
    RequestContext,
    SchedulingResult,
)
from heimdall_proxy.plugins.scheduling.scorers.session_affinity import (
    SessionAffinityScorer,
    decode_token,
    encode_token,
)
from heimdall_proxy.plugins.scheduling.session_affinity import SessionAffinityParams
from tests.helpers import ep
from tests.plugins.helpers import ctx, req

PODS = [ep("vllm-0"), ep("vllm-1")]


def scores(token: str | None) -> dict[str, float]:
    scorer = SessionAffinityScorer("s", SessionAffinityParams(), None)  # type: ignore[arg-type]
    headers = {"x-session-token": token} if token is not None else {}
    return dict(scorer.score(CycleState(), req(headers=headers), PODS))


def test_token_round_trip() -> None:
    assert encode_token("vllm-1") == base64.b64encode(b"vllm-1").decode()
    assert decode_token(encode_token("vllm-1")) == "vllm-1"


def test_token_selects_its_pod() -> None:
    assert scores(encode_token("vllm-1")) == {"vllm-0": 0.0, "vllm-1": 1.0}


def test_llm_d_namespaced_token_matches_the_pod_name() -> None:
    assert scores(encode_token("default/vllm-0")) == {"vllm-0": 1.0, "vllm-1": 0.0}


def test_no_token_forged_or_unknown_tokens_score_zero_everywhere() -> None:
    for token in (
        None,
        "",
        "%%%not-base64%%%",
        encode_token("10.0.0.9:8000"),
        "dmxsbS0x!",
        base64.b64encode(b"\xff\xfe").decode(),
    ):
        assert scores(token) == {"vllm-0": 0.0, "vllm-1": 0.0}, token


async def test_response_sets_token_of_serving_pod() -> None:
    scorer = SessionAffinityScorer("s", SessionAffinityParams(), None)  # type: ignore[arg-type]
    c = ctx(req(), PODS[1])
    await scorer.response_received(c)
    assert c.response_headers["x-session-token"] == encode_token("vllm-1")


async def test_session_id_strategy_prefers_the_pod_that_served_the_session() -> None:
    params = SessionAffinityParams.model_validate({"strategy": "session_id"})
    scorer = SessionAffinityScorer("s", params, None)  # type: ignore[arg-type]
    request = req(headers={"x-session-id": "conv"})
    state = CycleState()
    assert dict(scorer.score(state, request, PODS)) == {"vllm-0": 0.0, "vllm-1": 0.0}
    result = SchedulingResult({"default": ProfileResult([PODS[1]])}, "default")
    c = RequestContext(request, state, result, PODS[1])
    await scorer.pre_request(c)
    await scorer.response_received(c)
    assert c.response_headers == {}  # the client owns its id: nothing written back
    again = dict(scorer.score(CycleState(), req(headers={"x-session-id": "conv"}), PODS))
    assert again == {"vllm-0": 0.0, "vllm-1": 1.0}
