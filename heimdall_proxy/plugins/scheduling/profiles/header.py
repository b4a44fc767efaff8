"""header-profile-handler: runs the one scheduling profile a request header names, for a
caller that drives the stages of a disaggregated request itself, one call per stage."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import Field, field_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.plugins import SchedulerProfileView
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    InferenceRequest,
    ProfileResult,
    SchedulingError,
    SchedulingResult,
)

HEADER_PROFILE_HANDLER_TYPE = "header-profile-handler"
DEFAULT_PROFILE_HEADER = "EPP-Profile"
DEFAULT_PROFILE = "decode"

log = logging.getLogger(__name__)


class HeaderProfileParams(PluginParams):
    #: Matched case-insensitively, as header names are.
    header_name: str = Field(default=DEFAULT_PROFILE_HEADER, validate_default=True)
    #: Run when the header is missing or blank; matched case-sensitively, as profile names.
    default_profile: str = DEFAULT_PROFILE

    @field_validator("header_name", mode="after")
    @classmethod
    def _header(cls, value: str) -> str:
        return value.strip().lower() or DEFAULT_PROFILE_HEADER.lower()

    @field_validator("default_profile", mode="after")
    @classmethod
    def _profile(cls, value: str) -> str:
        return value.strip() or DEFAULT_PROFILE


@register(HEADER_PROFILE_HANDLER_TYPE, HeaderProfileParams)
class HeaderProfileHandler(BasePlugin[HeaderProfileParams]):
    """Runs exactly one profile per request, and its pick is the primary:
    - with one profile configured, that one, whatever the header says (a deployment scaled
      down to one stage works without changing handler or callers);
    - else the profile the `headerName` header names (its value trimmed, matched exactly);
    - else, when the header is missing or blank, `defaultProfile` (calls that never carry
      it, such as a plain client's, are served);
    - a value naming no configured profile runs nothing: the request fails as one no pod
      can serve, and the reason (a bad value, or a defaultProfile that is not configured)
      is logged, as llm-d does, which answers it with a 429 for the same reason.

    Unlike disagg-profile-handler it never picks a second stage: the caller (a coordinator)
    knows which stage each call is for and makes one call per stage."""

    type = HEADER_PROFILE_HANDLER_TYPE

    def __init__(self, name: str, params: HeaderProfileParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.header = params.header_name
        self.default_profile = params.default_profile

    def validate_profiles(self, profiles: Mapping[str, SchedulerProfileView]) -> None:
        if len(profiles) > 1 and self.default_profile not in profiles:
            # llm-d loads such a config; the requests without the header then fail.
            log.warning(
                "plugin %r (type %r): defaultProfile %r is not a configured scheduling profile "
                "(%s): requests without the %s header will find no profile to run",
                self.name,
                self.type,
                self.default_profile,
                ", ".join(sorted(profiles)),
                self.header,
            )

    def _requested(self, request: InferenceRequest) -> str:
        return (request.headers.get(self.header) or "").strip()

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if results:
            return []
        if len(profiles) == 1:
            return list(profiles)
        requested = self._requested(request)
        chosen = requested or self.default_profile
        if chosen in profiles:
            return [chosen]
        log.info(
            "no scheduling profile selected for request",
            extra={
                "error": self._no_match(requested),
                "profile": chosen,
                "profiles": sorted(profiles),
                "request_id": request.request_id,
            },
        )
        return []

    def _no_match(self, requested: str) -> str:
        if not requested:
            return (
                f"the {self.header} header is missing and defaultProfile "
                f"{self.default_profile!r} is not a configured scheduling profile"
            )
        return f"no scheduling profile is configured for {self.header} value {requested!r}"

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        if not results:
            raise SchedulingError(self._no_match(self._requested(request)))
        if len(results) > 1:
            raise SchedulingError(f"{self.type} runs one profile per request, got {len(results)}")
        name = next(iter(results))
        result = results[name]
        if result is None or not result.targets:
            raise SchedulingError(f"no endpoint passed the filters of profile {name!r}")
        return SchedulingResult(results, name)
