"""data-parallel-profile-handler: one profile, sent to the primary port, naming the rank."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.types import (
    CycleState,
    ProfileResult,
    RequestContext,
    SchedulingError,
)
from heimdall_proxy.plugins.scheduling.profiles.data_parallel import (
    DataParallelParams,
    DataParallelProfileHandler,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

RANKS = [ep("rank-1", host="10.0.0.5", port=8001), ep("rank-0", host="10.0.0.5", port=8000)]


def handler(**params: Any) -> DataParallelProfileHandler:
    return DataParallelProfileHandler("dp", DataParallelParams.model_validate(params), ledger())


def schedule(h: DataParallelProfileHandler) -> tuple[Any, CycleState]:
    state, request, results = CycleState(), req(), {}
    while names := h.pick_profiles(state, request, {"default": None}, results):  # type: ignore[dict-item]
        for name in names:
            results[name] = ProfileResult([RANKS[0]], list(RANKS))
    return h.process_results(state, request, results), state


async def test_the_pick_goes_to_the_primary_port_naming_its_rank() -> None:
    result, state = schedule(handler())  # primaryPort defaults to 8000
    target = result.primary.targets[0]
    assert (target.name, target.url, target.port) == ("rank-1", "http://10.0.0.5:8000", 8000)
    assert [e.port for e in result.primary.ranked] == [8000, 8000]
    ctx = RequestContext(req(), state, result, target)
    await handler().pre_request(ctx)
    assert ctx.upstream_headers == {"x-data-parallel-host-port": "10.0.0.5:8001"}
    # a fallback attempt names its own rank
    fallback = RequestContext(req(), state, result, result.primary.ranked[1], attempt=1)
    await handler().pre_request(fallback)
    assert fallback.upstream_headers["x-data-parallel-host-port"] == "10.0.0.5:8000"


def test_primary_port_is_a_port_and_zero_keeps_each_picks_own() -> None:
    result, _ = schedule(handler(primaryPort=0))
    assert result.primary.targets[0].port == 8001
    for bad in (-1, 65536):
        with pytest.raises(ValidationError):
            DataParallelParams.model_validate({"primaryPort": bad})


def test_one_profile_only_and_deprecated(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        h = handler()
    assert "deprecated" in caplog.text
    h.validate_profiles({"default": None})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="exactly one"):
        h.validate_profiles({"a": None, "b": None})  # type: ignore[dict-item]


def test_no_pick_is_a_scheduling_error() -> None:
    with pytest.raises(SchedulingError):
        handler().process_results(CycleState(), req(), {"default": None})
