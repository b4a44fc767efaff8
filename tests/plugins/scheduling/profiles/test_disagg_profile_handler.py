"""disagg-profile-handler and pd-profile-handler, with plain endpoints and fake profiles."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from heimdall_proxy.framework.disagg import read_plan
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    SchedulingError,
)
from heimdall_proxy.plugins.requestcontrol.disagg_headers import (
    DisaggHeadersHandler,
    DisaggHeadersParams,
)
from heimdall_proxy.plugins.scheduling.deciders.always import (
    AlwaysDisaggMultimodalDecider,
    AlwaysDisaggPDDecider,
)
from heimdall_proxy.plugins.scheduling.profiles.disagg import (
    DisaggProfileHandler,
    DisaggProfileHandlerParams,
    PDProfileHandler,
    PDProfileHandlerParams,
)
from tests.helpers import ep
from tests.plugins.helpers import req

PODS = {"decode": ep("d0"), "prefill": ep("p0"), "encode": ep("e0")}


class Never:
    type = "never-decider"
    name = "never"

    def decide(self, state: CycleState, request: InferenceRequest, decode: Endpoint) -> bool:
        return False


def handle(**extra: object) -> PluginHandle:
    h = PluginHandle(pool=None)  # type: ignore[arg-type]
    h.add("hdr", DisaggHeadersHandler("hdr", DisaggHeadersParams(), h))
    h.add("pd", AlwaysDisaggPDDecider("pd", NoParams(), h))
    h.add("mm", AlwaysDisaggMultimodalDecider("mm", NoParams(), h))
    h.add("never", Never())
    for name, plugin in extra.items():
        h.add(name, plugin)
    return h


def disagg(params: dict[str, Any], h: PluginHandle | None = None) -> DisaggProfileHandler:
    p = DisaggProfileHandlerParams.model_validate(params)
    return DisaggProfileHandler("dph", p, h or handle())


def run(handler: Any, request: InferenceRequest, pods: dict[str, Endpoint] = PODS) -> Any:
    """Drive the handler as the scheduler does, each profile picking its one pod."""
    state = CycleState()
    results: dict[str, ProfileResult | None] = {}
    order = []
    while names := handler.pick_profiles(state, request, {}, results):
        for name in names:
            order.append(name)
            pod = pods.get(name)
            results[name] = ProfileResult([pod], [pod]) if pod else None
    return order, handler.process_results(state, request, results), state


MM = req("chat", {"messages": [{"content": [{"type": "image_url", "image_url": {"url": "u"}}]}]})


def test_decode_first_then_encode_then_prefill() -> None:
    handler = disagg({"deciders": {"prefill": "pd", "encode": "mm"}})
    order, result, state = run(handler, MM)
    assert order == ["decode", "encode", "prefill"]
    assert result.primary_profile == "decode" and result.primary.targets == [PODS["decode"]]
    plan = read_plan(state)
    assert plan is not None and plan.prefill is PODS["prefill"] and plan.encode == [PODS["encode"]]
    assert plan.mode == "gateway"


def test_stages_run_only_when_their_decider_says_so() -> None:
    handler = disagg({"deciders": {"prefill": "never", "encode": "mm"}})
    order, _, state = run(handler, req("chat", {"messages": [{"content": "text"}]}))
    assert order == ["decode"]
    plan = read_plan(state)
    assert plan is not None and plan.prefill is None and plan.encode == []
    assert run(disagg({}), MM)[0] == ["decode"]  # no decider: no stage


def test_no_decode_pod_is_a_scheduling_error_and_no_prefill_pod_is_decode_only() -> None:
    handler = disagg({"deciders": {"prefill": "pd"}})
    with pytest.raises(SchedulingError, match="decode profile"):
        run(handler, MM, {"prefill": PODS["prefill"]})
    order, _, state = run(handler, MM, {"decode": PODS["decode"]})
    assert order == ["decode", "prefill"]
    plan = read_plan(state)
    assert plan is not None and plan.prefill is None


def test_nested_parameters_and_defaults() -> None:
    handler = disagg({"profiles": {"decode": "D", "prefill": "P"}, "deciders": {"prefill": "pd"}})
    assert (handler.decode_profile, handler.prefill_profile, handler.encode_profile) == (
        "D",
        "P",
        "encode",
    )
    assert run(handler, MM, {"D": PODS["decode"], "P": PODS["prefill"]})[0] == ["D", "P"]


def test_legacy_flat_parameters_map_and_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        handler = disagg(
            {
                "decodeProfile": "D",
                "prefillProfile": "P",
                "encodeProfile": "E",
                "deciderPluginName": "never",
                "prefillDeciderPluginName": "pd",
                "encodeDeciderPluginName": "mm",
            }
        )
    assert (handler.decode_profile, handler.prefill_profile, handler.encode_profile) == (
        "D",
        "P",
        "E",
    )
    # prefillDeciderPluginName wins over deciderPluginName
    assert handler.prefill_decider is not None and handler.prefill_decider.name == "pd"  # type: ignore[attr-defined]
    assert handler.encode_decider is not None
    deprecated = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(deprecated) == 6
    assert any("'deciderPluginName' is deprecated; use deciders.prefill" in m for m in deprecated)
    only_legacy = disagg({"deciderPluginName": "pd"})
    assert only_legacy.prefill_decider is not None


def test_nested_value_wins_over_legacy() -> None:
    handler = disagg({"prefillProfile": "old", "profiles": {"prefill": "new"}})
    assert handler.prefill_profile == "new"


def test_validate_profiles_names_the_missing_ones() -> None:
    handler = disagg({"deciders": {"prefill": "pd", "encode": "mm"}})
    handler.validate_profiles({"decode": object(), "prefill": object(), "encode": object()})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="encode profile 'encode'"):
        handler.validate_profiles({"decode": object(), "prefill": object()})  # type: ignore[dict-item]
    disagg({}).validate_profiles({"decode": object()})  # type: ignore[dict-item]


def test_a_decider_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a decider"):
        disagg({"deciders": {"prefill": "hdr"}})


def test_headers_mode_is_taken_from_the_headers_handler() -> None:
    h = PluginHandle(pool=None)  # type: ignore[arg-type]
    params = DisaggHeadersParams.model_validate({"mode": "headers", "hopTimeout": "5s"})
    h.add("prefill-header-handler", DisaggHeadersHandler("prefill-header-handler", params, h))
    h.add("pd", AlwaysDisaggPDDecider("pd", NoParams(), h))
    _, _, state = run(disagg({"deciders": {"prefill": "pd"}}, h), MM)
    plan = read_plan(state)
    assert plan is not None and plan.mode == "headers" and plan.hop_timeout == 5.0


def test_pd_profile_handler_defaults_hint_and_primary_port() -> None:
    params = PDProfileHandlerParams.model_validate({"primaryPort": 8200, "deciderPluginName": "pd"})
    assert params.prefix_plugin_type == "prefix-cache-scorer"
    handler = PDProfileHandler("pdh", params, handle())
    # the seeds' default pair names the default prefix-cache-scorer, whose producer is the
    # default approx-prefix-cache-producer
    assert handler.prefix_hint is not None
    hinted = CycleState()
    info = PrefixCacheMatchInfo(16, 1, 16, {"d0": 1.0})
    hinted[prefix_match_key("approx-prefix-cache-producer", "approx-prefix-cache-producer")] = info
    assert handler.prefix_hint(hinted) is info
    order, result, state = run(handler, MM)
    assert order == ["decode", "prefill"]
    [target] = result.primary.targets
    assert target.port == 8200 and target.url == "http://d0:8200" and target.name == "d0"
    assert PODS["decode"].port == 8000  # the pool's endpoint is not changed
    plan = read_plan(state)
    assert plan is not None and plan.prefill is PODS["prefill"] and plan.prefill.port == 8000
    assert PDProfileHandlerParams().decider_plugin_name == "prefix-based-pd-decider"
    with pytest.raises(ValueError, match="primaryPort"):
        PDProfileHandlerParams.model_validate({"primaryPort": 65536})
    with pytest.raises(ValueError, match="primaryPort"):
        PDProfileHandlerParams.model_validate({"primaryPort": -1})


def test_the_decode_pick_is_published_as_the_peer_of_the_prefill_profile() -> None:
    from heimdall_proxy.framework.disagg import PEER_ENDPOINT_KEY

    _, _, state = run(disagg({"deciders": {"prefill": "pd"}}), MM)
    assert state[PEER_ENDPOINT_KEY] is PODS["decode"]
    _, _, state = run(disagg({"deciders": {"prefill": "never"}}), MM)
    assert PEER_ENDPOINT_KEY not in state  # no prefill stage: no later profile to tell
