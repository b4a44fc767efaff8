"""disagg-headers-handler (alias prefill-header-handler)."""

from __future__ import annotations

from heimdall_proxy.framework.disagg import DISAGG_PLAN_KEY, DisaggPlan
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.types import (
    CycleState,
    ProfileResult,
    RequestContext,
    SchedulingResult,
)
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.requestcontrol.disagg_headers import (
    DisaggHeadersHandler,
    DisaggHeadersParams,
)
from tests.helpers import ep
from tests.plugins.helpers import req

HANDLE = PluginHandle(pool=None)  # type: ignore[arg-type]
D, P, E1, E2 = ep("d"), ep("p"), ep("e1"), ep("e2")


def context(
    results: dict[str, ProfileResult | None], plan: DisaggPlan | None = None
) -> RequestContext:
    state = CycleState()
    if plan is not None:
        state[DISAGG_PLAN_KEY] = plan
    return RequestContext(req(), state, SchedulingResult(results, "decode"), D)


def handler(**params: str) -> DisaggHeadersHandler:
    return DisaggHeadersHandler("h", DisaggHeadersParams.model_validate(params), HANDLE)


def test_alias_resolves_to_the_same_plugin() -> None:
    registry = load_builtin_plugins()
    a, b = registry.get("disagg-headers-handler"), registry.get("prefill-header-handler")
    assert a is not None and b is not None and a.factory is b.factory and a.params is b.params
    params = DisaggHeadersParams()
    assert (params.prefill_profile, params.encode_profile, params.mode) == (
        "prefill",
        "encode",
        "gateway",
    )


async def test_headers_name_the_stages_that_ran() -> None:
    plan = DisaggPlan(prefill=P, encode=[E1, E2], prefill_done=P, encode_done=[E1, E2])
    ctx = context({"decode": ProfileResult([D])}, plan)
    await handler().pre_request(ctx)
    assert ctx.upstream_headers == {
        "mif-prefill-endpoint": "p:8000",
        "mif-encode-endpoints": "e1:8000,e2:8000",
    }


async def test_a_stage_chosen_but_failed_is_not_named() -> None:
    ctx = context({"decode": ProfileResult([D])}, DisaggPlan(prefill=P, encode=[E1]))
    await handler().pre_request(ctx)
    assert ctx.upstream_headers == {}


async def test_without_a_plan_the_profiles_picks_are_published() -> None:
    results: dict[str, ProfileResult | None] = {
        "decode": ProfileResult([D]),
        "pf": ProfileResult([P]),
        "enc": ProfileResult([E1, E2]),
    }
    ctx = context(results)
    await handler(prefillProfile="pf", encodeProfile="enc").pre_request(ctx)
    assert ctx.upstream_headers["mif-prefill-endpoint"] == "p:8000"
    assert ctx.upstream_headers["mif-encode-endpoints"] == "e1:8000,e2:8000"
    ctx = context({"decode": ProfileResult([D]), "prefill": None})
    await handler().pre_request(ctx)
    assert ctx.upstream_headers == {}
