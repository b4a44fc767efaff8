"""header-profile-handler: the profile a header names, one per request."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from heimdall_proxy.framework.types import CycleState, ProfileResult, SchedulingError
from heimdall_proxy.plugins.scheduling.profiles.header import (
    HeaderProfileHandler,
    HeaderProfileParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

STAGES = {"encode": None, "prefill": None, "decode": None}


def handler(**params: Any) -> HeaderProfileHandler:
    return HeaderProfileHandler("hp", HeaderProfileParams.model_validate(params), ledger())


def ran(h: HeaderProfileHandler, headers: dict[str, str], profiles: dict[str, Any] = STAGES) -> Any:
    """The profiles run (each picking a pod of its name) and the primary, as the scheduler
    drives the handler; SchedulingError when nothing could run."""
    state, request, results = CycleState(), req(headers=headers), {}
    order = []
    while names := h.pick_profiles(state, request, profiles, results):
        for name in names:
            order.append(name)
            results[name] = ProfileResult([ep(name)], [ep(name)])
    return order, h.process_results(state, request, results).primary_profile


def test_the_header_names_the_profile() -> None:
    assert ran(handler(), {"epp-profile": "prefill"}) == (["prefill"], "prefill")
    assert ran(handler(), {"epp-profile": "  encode "}) == (["encode"], "encode")


def test_missing_or_blank_header_runs_the_default_profile() -> None:
    assert ran(handler(), {}) == (["decode"], "decode")
    assert ran(handler(), {"epp-profile": " "}) == (["decode"], "decode")
    assert ran(handler(defaultProfile="prefill"), {}) == (["prefill"], "prefill")


def test_a_single_profile_always_runs() -> None:
    assert ran(handler(), {"epp-profile": "nope"}, {"only": None}) == (["only"], "only")


def test_an_unknown_value_runs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), pytest.raises(SchedulingError, match="'Prefill'"):
        ran(handler(), {"epp-profile": "Prefill"})  # profile names are case-sensitive
    assert "no scheduling profile selected" in caplog.text


def test_header_name_is_case_insensitive() -> None:
    h = handler(headerName="X-Stage")
    assert h.header == "x-stage"
    assert ran(h, {"x-stage": "encode"}) == (["encode"], "encode")


def test_a_default_profile_not_configured_is_warned_at_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = handler(defaultProfile="missing")
    with caplog.at_level(logging.WARNING):
        h.validate_profiles(STAGES)  # type: ignore[arg-type]
    assert "defaultProfile 'missing'" in caplog.text
    with pytest.raises(SchedulingError, match="missing"):
        ran(h, {})
