"""single-profile-handler: runs the one scheduling profile, which is the primary."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.plugins import SchedulerProfileView
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    InferenceRequest,
    ProfileResult,
    SchedulingError,
    SchedulingResult,
)

SINGLE_PROFILE_HANDLER_TYPE = "single-profile-handler"


class OneProfile:
    """What a handler of exactly one profile does: check there is one, run it once, and
    read its result (single-profile-handler, data-parallel-profile-handler)."""

    def validate_profiles(self, profiles: Mapping[str, SchedulerProfileView]) -> None:
        if len(profiles) != 1:
            raise ValueError(f"needs exactly one scheduling profile, found {len(profiles)}")

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        return [] if results else list(profiles)

    @staticmethod
    def the_result(results: dict[str, ProfileResult | None]) -> tuple[str, ProfileResult]:
        """The profile's name and its result; SchedulingError when it kept no pod."""
        name = next(iter(results))
        result = results[name]
        if result is None or not result.targets:
            raise SchedulingError(f"no endpoint passed the filters of profile {name!r}")
        return name, result


@register(SINGLE_PROFILE_HANDLER_TYPE)
class SingleProfileHandler(OneProfile, BasePlugin[NoParams]):
    """Runs the single configured profile once; its pick is the primary target."""

    type = SINGLE_PROFILE_HANDLER_TYPE

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        name, _ = self.the_result(results)
        return SchedulingResult(results, name)
