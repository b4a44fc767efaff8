"""disagg-profile-handler and the legacy pd-profile-handler: decode first (the primary),
then the encode and prefill stages their deciders ask for."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import ClassVar, Self

from pydantic import Field, model_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.disagg import (
    DEFAULT_DISAGG_SETTINGS,
    DISAGG_PLAN_KEY,
    LLMD_ENCODE_HEADER,
    LLMD_PREFILL_HEADER,
    PEER_ENDPOINT_KEY,
    PREFIX_PLUGIN_HINT_KEY,
    DisaggPlan,
    DisaggSettings,
    DisaggSettingsOwner,
    read_plan,
)
from heimdall_proxy.framework.handle import PluginHandle, PluginLookupError
from heimdall_proxy.framework.log import V4
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.plugins import Decider, SchedulerProfileView
from heimdall_proxy.framework.prefix import MatchReader, prefix_match_reader
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    RequestContext,
    SchedulingError,
    SchedulingResult,
)

log = logging.getLogger(__name__)

#: The APIs whose requests the prefill and encode hops can be made of (vLLM's OpenAI server
#: takes kv_transfer_params and ec_transfer_params there); a request of another API (the
#: Messages API, a pre-tokenized generate, a passthrough) is served by its decode pod alone.
#: Without a headers handler: the decode pods' sidecar sends the hops (llm-d's semantics).
SIDECAR_SETTINGS = DisaggSettings("headers")
HOP_APIS = frozenset({"completions", "chat", "responses"})

DISAGG_PROFILE_HANDLER_TYPE = "disagg-profile-handler"
PD_PROFILE_HANDLER_TYPE = "pd-profile-handler"
#: The plugin type the handlers need when a decider is set (alias instances share it).
DISAGG_HEADERS_HANDLER_TYPE = "disagg-headers-handler"


class DisaggProfiles(PluginParams):
    decode: str = "decode"
    prefill: str = "prefill"
    encode: str = "encode"


class DisaggDeciders(PluginParams):
    prefill: str | None = None
    encode: str | None = None


class DisaggProfileHandlerParams(PluginParams):
    profiles: DisaggProfiles = Field(default_factory=DisaggProfiles)
    deciders: DisaggDeciders = Field(default_factory=DisaggDeciders)
    # Legacy flat parameters (deprecated): each maps into the nested form.
    #: Deprecated: use `profiles.decode`.
    decode_profile: str | None = None
    #: Deprecated: use `profiles.prefill`.
    prefill_profile: str | None = None
    #: Deprecated: use `profiles.encode`.
    encode_profile: str | None = None
    #: Deprecated: use `deciders.prefill`.
    prefill_decider_plugin_name: str | None = None
    #: Deprecated: use `deciders.encode`.
    encode_decider_plugin_name: str | None = None
    #: Deprecated: use `deciders.prefill` (`prefillDeciderPluginName` wins over it).
    decider_plugin_name: str | None = None


#: Legacy flat parameter -> (nested group, key), in the reference's order.
_LEGACY = (
    ("decode_profile", "decodeProfile", "profiles", "decode"),
    ("prefill_profile", "prefillProfile", "profiles", "prefill"),
    ("encode_profile", "encodeProfile", "profiles", "encode"),
    # deciderPluginName before prefillDeciderPluginName, so the latter wins
    ("decider_plugin_name", "deciderPluginName", "deciders", "prefill"),
    ("prefill_decider_plugin_name", "prefillDeciderPluginName", "deciders", "prefill"),
    ("encode_decider_plugin_name", "encodeDeciderPluginName", "deciders", "encode"),
)


def resolve_disagg_params(
    params: DisaggProfileHandlerParams, name: str
) -> tuple[DisaggProfiles, DisaggDeciders]:
    """The nested parameters with the legacy flat ones mapped in (each logs a deprecation
    warning). A nested value set explicitly wins over a legacy one."""
    groups: dict[str, dict[str, str | None]] = {
        "profiles": params.profiles.model_dump(),
        "deciders": params.deciders.model_dump(),
    }
    explicit = {
        "profiles": params.profiles.model_fields_set,
        "deciders": params.deciders.model_fields_set,
    }
    for attr, alias, group, key in _LEGACY:
        value = getattr(params, attr)
        if value is None:
            continue
        log.warning(
            "plugin %r (type %r): parameter %r is deprecated; use %s.%s",
            name,
            DISAGG_PROFILE_HANDLER_TYPE,
            alias,
            group,
            key,
        )
        if key not in explicit[group]:
            groups[group][key] = value
    return DisaggProfiles(**groups["profiles"]), DisaggDeciders(**groups["deciders"])


class _DisaggHandler:
    """Shared by both handlers: decode first, then encode, then prefill, each when its
    decider says so; the plan of the extra stages goes onto the CycleState."""

    type: ClassVar[str]
    name: str
    decode_profile: str
    prefill_profile: str
    encode_profile: str
    prefill_decider: Decider | None
    encode_decider: Decider | None
    settings: DisaggSettings
    primary_port: int = 0
    prefix_hint: MatchReader | None = None
    #: No headers handler is declared: this handler writes llm-d's headers (headers mode).
    writes_headers: bool = False

    def _setup(
        self,
        handle: PluginHandle,
        prefill_decider: tuple[str, str | None],
        encode_decider: tuple[str, str | None],
    ) -> None:
        """Resolve the deciders and disagg-headers-handler among the plugins declared.
        Raises ValueError (the loader reports it as a config error)."""
        self.prefill_decider = self._decider(handle, *prefill_decider)
        self.encode_decider = self._decider(handle, *encode_decider)
        self.settings = DEFAULT_DISAGG_SETTINGS
        if self.prefill_decider is None and self.encode_decider is None:
            return
        owner = next(
            (p for p in handle.plugins().values() if isinstance(p, DisaggSettingsOwner)), None
        )
        if owner is None:
            # llm-d's semantics since it deprecated the headers handler: this handler names
            # the chosen pods in llm-d's headers and the decode pod's sidecar sends the hops.
            self.settings = SIDECAR_SETTINGS
            self.writes_headers = True
            log.warning(
                "%s %r: no %s is declared, so, as in llm-d, the prefill and encode pods it "
                "picks are named in %s / %s for the decode pods' routing sidecar, which sends "
                "the hops; declare %s (mode: gateway) to have this gateway send them itself",
                self.type,
                self.name,
                DISAGG_HEADERS_HANDLER_TYPE,
                LLMD_PREFILL_HEADER,
                LLMD_ENCODE_HEADER,
                DISAGG_HEADERS_HANDLER_TYPE,
            )
            return
        self.settings = owner.disagg_settings

    async def pre_request(self, ctx: RequestContext) -> None:
        """Without a headers handler: the pods of the stages it chose, in llm-d's headers."""
        if not self.writes_headers:
            return
        plan = read_plan(ctx.state)
        if plan is None:
            return
        if plan.prefill_done is not None:
            ctx.upstream_headers[LLMD_PREFILL_HEADER] = plan.prefill_done.hostport
        if plan.encode_done:
            hosts = ",".join(e.hostport for e in plan.encode_done)
            ctx.upstream_headers[LLMD_ENCODE_HEADER] = hosts

    def _decider(self, handle: PluginHandle, param: str, name: str | None) -> Decider | None:
        if not name:
            return None
        try:
            plugin = handle.plugin(name)
        except PluginLookupError:
            raise ValueError(
                f"{param}: decider {name!r} is not declared (needed by {self.type} {self.name!r})"
            ) from None
        if not isinstance(plugin, Decider):
            raise ValueError(
                f"{param}: plugin {name!r} (type {getattr(plugin, 'type', '?')!r}) is not a decider"
            )
        return plugin

    def validate_profiles(self, profiles: Mapping[str, SchedulerProfileView]) -> None:
        needed = [("decode", self.decode_profile)]
        if self.encode_decider is not None:
            needed.append(("encode", self.encode_profile))
        if self.prefill_decider is not None:
            needed.append(("prefill", self.prefill_profile))
        missing = [f"{stage} profile {name!r}" for stage, name in needed if name not in profiles]
        if missing:
            raise ValueError(
                "no scheduling profile for the "
                + ", ".join(missing)
                + f" (declared: {', '.join(repr(p) for p in profiles) or 'none'})"
            )

    def _decide(
        self,
        state: CycleState,
        request: InferenceRequest,
        decider: Decider,
        stage: str,
        decode: Endpoint,
    ) -> bool:
        decided = decider.decide(state, request, decode)
        if log.isEnabledFor(V4):
            log.log(
                V4,
                "Decider ran",
                extra={
                    "decider": getattr(decider, "name", "?"),
                    "stage": stage,
                    "run": decided,
                    "request_id": request.request_id,
                },
            )
        return decided

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if self.decode_profile not in results:
            return [self.decode_profile]
        decode = results[self.decode_profile]
        if decode is None or not decode.targets:
            return []
        done_key = f"{DISAGG_PLAN_KEY}#{self.name}"
        if state.get(done_key):
            return []
        state[done_key] = True
        if request.api not in HOP_APIS:
            return []  # the hops are vLLM OpenAI requests with transfer params: served whole
        if self.prefix_hint is not None:
            state[PREFIX_PLUGIN_HINT_KEY] = self.prefix_hint
        target = decode.targets[0]
        stages = []
        if self.encode_decider is not None and self._decide(
            state, request, self.encode_decider, "encode", target
        ):
            stages.append(self.encode_profile)
        if self.prefill_decider is not None and self._decide(
            state, request, self.prefill_decider, "prefill", target
        ):
            state[PEER_ENDPOINT_KEY] = target  # the prefill profile may prefer pods near it
            stages.append(self.prefill_profile)
        return stages

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if decode is None or not decode.targets:
            raise SchedulingError(
                f"no endpoint passed the filters of the decode profile {self.decode_profile!r}"
            )
        if self.primary_port:
            decode.targets = [e.with_port(self.primary_port) for e in decode.targets]
            decode.ranked = [e.with_port(self.primary_port) for e in decode.ranked]
        plan = DisaggPlan(self.settings)
        if self.prefill_profile in results and self.prefill_profile != self.decode_profile:
            prefill = results[self.prefill_profile]
            if prefill is not None and prefill.targets:
                plan.prefill = chosen = prefill.targets[0]
                plan.prefill_fallback = [e for e in prefill.ranked if e.name != chosen.name]
            else:
                log.info(
                    "prefill was decided but no pod passed the prefill profile; decode only",
                    extra={"profile": self.prefill_profile, "request_id": request.request_id},
                )
        if self.encode_profile in results and self.encode_profile != self.decode_profile:
            encode = results[self.encode_profile]
            if encode is not None and encode.targets:
                plan.encode = list(encode.targets)
            else:
                log.info(
                    "encode was decided but no pod passed the encode profile",
                    extra={"profile": self.encode_profile, "request_id": request.request_id},
                )
        state[DISAGG_PLAN_KEY] = plan
        return SchedulingResult(results, self.decode_profile)


@register(DISAGG_PROFILE_HANDLER_TYPE, DisaggProfileHandlerParams)
class DisaggProfileHandler(_DisaggHandler, BasePlugin[DisaggProfileHandlerParams]):
    """Runs the decode profile first (its pick is the primary), then the encode profile when
    the `deciders.encode` plugin says so, then the prefill profile when `deciders.prefill`
    says so. An unset decider disables its stage. Deciders and disagg-headers-handler are
    looked up among the plugins declared earlier. Leaves a DisaggPlan on the CycleState."""

    type = DISAGG_PROFILE_HANDLER_TYPE

    def __init__(self, name: str, params: DisaggProfileHandlerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        profiles, deciders = resolve_disagg_params(params, name)
        self.decode_profile = profiles.decode
        self.prefill_profile = profiles.prefill
        self.encode_profile = profiles.encode
        self._setup(
            handle, ("deciders.prefill", deciders.prefill), ("deciders.encode", deciders.encode)
        )


class PDProfileHandlerParams(PluginParams):
    decode_profile: str = "decode"
    prefill_profile: str = "prefill"
    prefix_plugin_type: str = "prefix-cache-scorer"
    prefix_plugin_name: str | None = None
    #: llm-d's: the prefix producer whose match the decider reads; when set,
    #: prefixPluginType / prefixPluginName (the seeds') are not used.
    prefix_match_info_producer_name: str = ""
    primary_port: int = 0
    decider_plugin_name: str = "prefix-based-pd-decider"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.primary_port != 0 and not 1 <= self.primary_port <= 65535:
            raise ValueError(
                f"primaryPort must be between 1 and 65535 when set, got {self.primary_port}"
            )
        return self


@register(PD_PROFILE_HANDLER_TYPE, PDProfileHandlerParams)
class PDProfileHandler(_DisaggHandler, BasePlugin[PDProfileHandlerParams]):
    """Legacy prefill/decode handler (flat parameters, prefill decider only): decode first,
    then prefill when `deciderPluginName` says so; its prefix decider reads the match
    information of `prefixPluginType` / `prefixPluginName`. A non-zero `primaryPort`
    rewrites the decode endpoints' port (data parallelism)."""

    type = PD_PROFILE_HANDLER_TYPE

    def __init__(self, name: str, params: PDProfileHandlerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.decode_profile = params.decode_profile
        self.prefill_profile = params.prefill_profile
        self.encode_profile = ""
        self.primary_port = params.primary_port
        self.prefix_hint = prefix_match_reader(
            params.prefix_match_info_producer_name,
            params.prefix_plugin_type,
            params.prefix_plugin_name or params.prefix_plugin_type,
        )
        self._setup(handle, ("deciderPluginName", params.decider_plugin_name), ("", None))
