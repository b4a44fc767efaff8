"""Disaggregated serving: what the profile handlers, the disagg-headers-handler and the
server's hop code share.

A disaggregation profile handler (disagg-profile-handler, pd-profile-handler) leaves a
DisaggPlan on the CycleState: which prefill pod and which encode pods the scheduler chose for
the request, and whether the gateway itself sends them their hop (`gateway` mode) or only
names them in headers for a sidecar on the decode pod (`headers` mode). The server performs
the hops and records which stages really ran (`prefill_done`, `encode_done`); the
disagg-headers-handler then writes `mif-prefill-endpoint` / `mif-encode-endpoints` for those.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from heimdall_proxy.framework.prefix import MatchReader, PrefixCacheMatchInfo, prefix_match_reader
from heimdall_proxy.framework.types import ApiKind, CycleState, Endpoint

#: Upstream request header naming the prefill pod (host:port), for the decode pod.
PREFILL_ENDPOINT_HEADER = "mif-prefill-endpoint"
#: Upstream request header listing the encode pods (host:port,host:port), for the decode pod.
ENCODE_ENDPOINTS_HEADER = "mif-encode-endpoints"
#: llm-d's names of the same, which its disagg-profile-handler writes for the decode pod's
#: routing sidecar when no (deprecated) disagg-headers-handler is declared.
LLMD_PREFILL_HEADER = "x-prefiller-host-port"
LLMD_ENCODE_HEADER = "x-encoder-hosts-ports"

#: Values of the `mif.moreh.io/role` label.
ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ROLE_BOTH = "both"
ROLE_ENCODE = "encode"
ROLE_ENCODE_PREFILL = "encode-prefill"
ROLE_ENCODE_PREFILL_DECODE = "encode-prefill-decode"

#: `gateway`: the gateway sends the encode and prefill hops itself (no sidecar needed);
#: `headers`: it only writes the mif-* headers and the decode pod's sidecar does the rest.
DisaggMode = Literal["gateway", "headers"]

#: CycleState key of the DisaggPlan.
DISAGG_PLAN_KEY = "disagg/plan"
#: CycleState key where a profile handler leaves the MatchReader of the prefix producer whose
#: match its prefill decider should read (pd-profile-handler's prefixMatchInfoProducerName,
#: or the seeds' prefixPluginType / prefixPluginName).
PREFIX_PLUGIN_HINT_KEY = "disagg/prefix-plugin"
#: CycleState key of the pod chosen in a request's earlier scheduling stage (the decode pod,
#: before the prefill profile runs), which the disaggregation profile handlers publish for the
#: plugins of the later profile to compare against (llm-d's `peer-endpoint` request
#: attribute; topology-affinity-filter and -scorer read it).
PEER_ENDPOINT_KEY = "peer-endpoint/disagg-profile-handler"
#: Without a hint: the default-named approx-prefix-cache-producer's match.
_DEFAULT_MATCH = prefix_match_reader()

#: Content-part types that carry an image, audio clip or video (chat and Responses API).
MULTIMODAL_PART_TYPES = frozenset(
    {"image_url", "input_image", "input_audio", "audio_url", "video_url", "input_video"}
)


@dataclass(frozen=True, slots=True)
class DisaggSettings:
    """How the extra stages run, one object for every reader: disagg-headers-handler owns it
    (its `mode` and `hopTimeout` parameters), the profile handler puts it on each plan, and
    the server's hops and the headers handler read it from there. `mode`: `gateway` (the
    gateway sends the hops) or `headers` (a sidecar on the decode pod does); `hop_timeout`
    bounds each hop (seconds)."""

    mode: DisaggMode = "gateway"
    hop_timeout: float = 60.0


DEFAULT_DISAGG_SETTINGS = DisaggSettings()


@runtime_checkable
class DisaggSettingsOwner(Protocol):
    """A plugin that owns the disaggregation settings (disagg-headers-handler)."""

    @property
    def disagg_settings(self) -> DisaggSettings: ...


@dataclass(slots=True)
class DisaggPlan:
    """The stages the scheduler chose besides decode, and (filled in by the server) the ones
    that ran. `prefill` is the chosen prefill pod; `encode` the chosen encode pods, best
    first."""

    settings: DisaggSettings = DEFAULT_DISAGG_SETTINGS
    prefill: Endpoint | None = None
    #: The prefill profile's other candidates, best first: where a prefill hop that could
    #: not reach `prefill` (or got a 5xx) goes next.
    prefill_fallback: list[Endpoint] = field(default_factory=list)
    encode: list[Endpoint] = field(default_factory=list)
    #: The prefill pod whose KV the decode request uses (None: prefill did not run or failed).
    prefill_done: Endpoint | None = None
    #: The encode pods whose encoder output the decode request uses.
    encode_done: list[Endpoint] = field(default_factory=list)

    @property
    def mode(self) -> DisaggMode:
        return self.settings.mode

    @property
    def hop_timeout(self) -> float:
        return self.settings.hop_timeout


def read_plan(state: CycleState) -> DisaggPlan | None:
    plan = state.get(DISAGG_PLAN_KEY)
    return plan if isinstance(plan, DisaggPlan) else None


def find_prefix_match(state: CycleState) -> PrefixCacheMatchInfo | None:
    """The prefix-cache match information on `state`: from the producer a profile handler
    named under PREFIX_PLUGIN_HINT_KEY when it did, else the default approx producer's, else
    the first prefix producer's that published one (a config normally declares one)."""
    hint: MatchReader | None = state.get(PREFIX_PLUGIN_HINT_KEY)
    if hint is not None:
        return hint(state)
    info = _DEFAULT_MATCH(state)
    if info is not None:
        return info
    for value in state.values():
        if isinstance(value, PrefixCacheMatchInfo):
            return value
    return None


def multimodal_parts(api: ApiKind, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every image / audio / video content part of a chat request's messages or a Responses
    request's input, in order."""
    out: list[dict[str, Any]] = []

    def scan(content: Any) -> None:
        if isinstance(content, Mapping):
            content = [content]
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in MULTIMODAL_PART_TYPES:
                    out.append(part)

    if api == "chat":
        messages = data.get("messages")
        if isinstance(messages, list):
            for msg in messages:
                if isinstance(msg, Mapping):
                    scan(msg.get("content"))
    elif api == "responses":
        inp = data.get("input")
        if isinstance(inp, list):
            for item in inp:
                if isinstance(item, Mapping):
                    scan(item)
                    scan(item.get("content"))
    return out


def is_multimodal(api: ApiKind, data: Mapping[str, Any]) -> bool:
    """True when the request holds at least one image, audio or video part."""
    return bool(multimodal_parts(api, data))
