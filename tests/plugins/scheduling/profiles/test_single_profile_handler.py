"""single-profile-handler."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.plugins import ProfileHandler, extension_points
from heimdall_proxy.framework.scheduler import SchedulerProfile
from heimdall_proxy.framework.types import (
    CycleState,
    InferenceRequest,
    ProfileResult,
    SchedulingError,
    ScoredEndpoint,
)
from heimdall_proxy.plugins.scheduling.profiles.single import (
    SINGLE_PROFILE_HANDLER_TYPE,
    SingleProfileHandler,
)
from tests.helpers import ep

REQ = InferenceRequest(api="chat", path="/", model="m", body=b"{}", data={}, headers={})


class FirstPicker:
    type = "first"
    name = "first"

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]
    ) -> ProfileResult:
        return ProfileResult([scored[0].endpoint])


def handler() -> SingleProfileHandler:
    return SingleProfileHandler("h", NoParams(), None)  # type: ignore[arg-type]


def profile(name: str = "default") -> SchedulerProfile:
    return SchedulerProfile(name, [], [], FirstPicker())


def test_type_and_extension_point() -> None:
    assert SINGLE_PROFILE_HANDLER_TYPE == "single-profile-handler"
    h = handler()
    assert isinstance(h, ProfileHandler)
    assert extension_points(h) == ["ProfileHandler"]


def test_validate_profiles_needs_exactly_one() -> None:
    h = handler()
    h.validate_profiles({"a": profile("a")})
    with pytest.raises(ValueError, match="exactly one scheduling profile, found 2"):
        h.validate_profiles({"a": profile("a"), "b": profile("b")})
    with pytest.raises(ValueError, match="found 0"):
        h.validate_profiles({})


def test_pick_profiles_runs_the_profile_once() -> None:
    h = handler()
    profiles = {"only": profile("only")}
    assert h.pick_profiles(CycleState(), REQ, profiles, {}) == ["only"]
    done = {"only": ProfileResult([ep("a")])}
    assert h.pick_profiles(CycleState(), REQ, profiles, done) == []
    # A profile that ended without a result also counts as run.
    assert h.pick_profiles(CycleState(), REQ, profiles, {"only": None}) == []


def test_process_results_makes_the_profile_primary() -> None:
    a, b = ep("a"), ep("b")
    res = ProfileResult([a], ranked=[a, b])
    result = handler().process_results(CycleState(), REQ, {"only": res})
    assert result.primary_profile == "only"
    assert result.primary is res
    assert result.fallback_order() == [a, b]


@pytest.mark.parametrize("res", [None, ProfileResult([])])
def test_process_results_without_target_raises(res: ProfileResult | None) -> None:
    with pytest.raises(SchedulingError, match="profile 'only'"):
        handler().process_results(CycleState(), REQ, {"only": res})
