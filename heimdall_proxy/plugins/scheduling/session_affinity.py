"""What session-affinity-filter and session-affinity-scorer share (llm-d's
util/sessionaffinity): their parameters and the two ways of knowing a session's pod.

- encoded_endpoint_header (the default): stateless. The answer carries the serving pod's
  name, base64-encoded, in a header the client sends back with its next request.
- session_id: the client sends an opaque session id of its own (a header, or a request
  attribute a producer published, e.g. session-id-producer's); the plugin remembers which
  pod served each id, forgetting an id unused for `evictionTtlSeconds`.

Either way a token or id only ever selects among the candidates the gateway already has, so a
client can never make the gateway dial an address of its choosing."""

from __future__ import annotations

import base64
import binascii
import logging
import time
from dataclasses import dataclass
from typing import Literal, Protocol, Self

from pydantic import Field, field_validator, model_validator

from heimdall_proxy.framework.attributes import data_key
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, RequestContext

log = logging.getLogger(__name__)

#: encoded_endpoint_header's default header, both ways.
SESSION_HEADER = "x-session-token"
#: session_id's default source.
SESSION_ID_HEADER = "x-session-id"
#: llm-d's request attribute of the agent-identity plugin, named with no producer.
AGENT_IDENTITY_KEY = data_key("agent-identity", "")


def encode_token(pod_name: str) -> str:
    return base64.b64encode(pod_name.encode()).decode("ascii")


def decode_token(token: str) -> str | None:
    """The pod name in a token, or None when the token is not base64 of UTF-8 text."""
    try:
        return base64.b64decode(token.strip(), validate=True).decode()
    except (binascii.Error, ValueError):
        return None


def _header_name(value: str) -> str:
    return value.strip().lower()


class EncodedEndpointHeaderConfig(PluginParams):
    #: The request and answer header carrying the base64 pod token.
    header: str = SESSION_HEADER

    @field_validator("header", mode="after")
    @classmethod
    def _header(cls, value: str) -> str:
        return _header_name(value) or SESSION_HEADER


class SessionIDSource(PluginParams):
    """One place a session id is read from: exactly one of a request `header` or an
    `attribute` a producer published on the request (under `producer`'s name; "" for an
    attribute published under none)."""

    #: A request header holding the id.
    header: str = ""
    #: A request attribute holding the id (SessionIDDataKey, agent-identity).
    attribute: str = ""
    #: The plugin that published the attribute ("" for none).
    producer: str = ""

    @model_validator(mode="after")
    def _one(self) -> Self:
        if bool(self.header) == bool(self.attribute):
            raise ValueError("exactly one of header or attribute must be set")
        return self


def _default_sources() -> list[SessionIDSource]:
    return [SessionIDSource(header=SESSION_ID_HEADER)]


class SessionIDConfig(PluginParams):
    #: Tried in order, the first non-empty value wins.
    sources: list[SessionIDSource] = Field(default_factory=_default_sources)
    #: How long a binding survives unused; 0 means the default, as in llm-d.
    eviction_ttl_seconds: float = 300.0
    #: How often expired bindings are dropped; 0 means the default.
    eviction_sweep_seconds: float = 10.0

    @field_validator("sources", mode="after")
    @classmethod
    def _sources(cls, value: list[SessionIDSource]) -> list[SessionIDSource]:
        return value or _default_sources()

    @field_validator("eviction_ttl_seconds", "eviction_sweep_seconds", mode="after")
    @classmethod
    def _positive(cls, value: float, info: object) -> float:
        if value < 0:
            raise ValueError(f"must be > 0, got {value}")
        if value == 0:
            return float(cls.model_fields[getattr(info, "field_name", "")].default)
        return value


class SessionAffinityParams(PluginParams):
    #: How the session's pod is known: a token in a header, or a remembered session id.
    strategy: Literal["encoded_endpoint_header", "session_id"] = "encoded_endpoint_header"
    #: The profile whose pick this instance pins (e.g. "prefill", with a second instance
    #: and header for it); empty: the primary pod, the one that answers.
    profile_name: str = ""
    #: encoded_endpoint_header's settings.
    encoded_endpoint_header_config: EncodedEndpointHeaderConfig = Field(
        default_factory=EncodedEndpointHeaderConfig
    )
    #: session_id's settings.
    session_id_config: SessionIDConfig = Field(default_factory=SessionIDConfig)


def find(endpoints: list[Endpoint], pod: str) -> Endpoint | None:
    """The candidate named `pod`; a `namespace/name` (llm-d's tokens) matches its name."""
    for e in endpoints:
        if e.name == pod:
            return e
    if "/" in pod:
        name = pod.rsplit("/", 1)[1]
        for e in endpoints:
            if e.name == name:
                return e
    return None


def pinned_pod(ctx: RequestContext, profile: str) -> Endpoint | None:
    """The pod this attempt pins: the one serving it, or the pick of `profile` (None when
    that profile did not run, e.g. a request served without a prefill stage)."""
    if not profile:
        return ctx.target
    result = ctx.result.profile_results.get(profile)
    return result.targets[0] if result is not None and result.targets else None


class SessionStrategy(Protocol):
    def choose(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Endpoint | None:
        """The session's pod among `endpoints`, None when the request states no usable
        preference."""
        ...

    def bind(self, ctx: RequestContext) -> None:
        """An attempt is about to be sent: remember its pod for the session."""
        ...

    def respond(self, ctx: RequestContext) -> None:
        """Answer headers arrived: tell the client its session's pod, if the strategy does."""
        ...


class EncodedEndpointHeader:
    """The session's pod is named in the request's header; answers name their pod there."""

    def __init__(self, header: str, profile: str) -> None:
        self.header = header
        self.profile = profile

    def choose(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Endpoint | None:
        token = request.headers.get(self.header)
        pod = decode_token(token) if token else None
        return find(endpoints, pod) if pod else None

    def bind(self, ctx: RequestContext) -> None:
        return None

    def respond(self, ctx: RequestContext) -> None:
        pod = pinned_pod(ctx, self.profile)
        if pod is not None:
            ctx.response_headers[self.header] = encode_token(pod.name)


@dataclass(slots=True)
class Binding:
    pod: str
    last_seen: float


class SessionBindings:
    """Session id -> the pod that served it. A session is placed by the other plugins the
    first time, and moves only when its pod is no longer a candidate (not because a picker
    chose another pod among several that include it)."""

    def __init__(self, config: SessionIDConfig, profile: str, name: str) -> None:
        self.sources = [
            (_header_name(s.header), data_key(s.attribute, s.producer) if s.attribute else "")
            for s in config.sources
        ]
        self.profile = profile
        self.ttl = config.eviction_ttl_seconds
        self.sweep_every = config.eviction_sweep_seconds
        #: CycleState key: whether this request's session pod was among the candidates.
        self.present_key = f"session-affinity/{name}#present"
        self.bindings: dict[str, Binding] = {}
        self._swept = time.monotonic()

    def session_id(self, state: CycleState, request: InferenceRequest) -> str:
        """The first non-empty id of the sources, "" for none (no preference: an id made
        up here could never match a binding). The `agent-identity` attribute (no producer)
        is the agent-identity plugin's, which it keeps on the request for flow control."""
        for header, key in self.sources:
            if header:
                value = request.headers.get(header)
            elif key == AGENT_IDENTITY_KEY:
                value = request.agent_identity
            else:
                value = state.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
        return ""

    def choose(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Endpoint | None:
        session = self.session_id(state, request)
        binding = self.bindings.get(session) if session else None
        if binding is None:
            return None
        target = next((e for e in endpoints if e.name == binding.pod), None)
        state[self.present_key] = target is not None
        return target

    def bind(self, ctx: RequestContext) -> None:
        session = self.session_id(ctx.state, ctx.request)
        pod = pinned_pod(ctx, self.profile) if session else None
        if pod is None:
            return
        now = time.monotonic()
        self.sweep(now)
        binding = self.bindings.get(session)
        if binding is None:
            self.bindings[session] = Binding(pod.name, now)
        elif binding.pod == pod.name:
            binding.last_seen = now
        elif ctx.state.get(self.present_key) is False:
            # Its pod was not a candidate for this request: the session moves. A request
            # that never looked (no record) moves nothing.
            log.debug(
                "session moved to another pod",
                extra={"from": binding.pod, "to": pod.name, "request_id": ctx.request.request_id},
            )
            self.bindings[session] = Binding(pod.name, now)

    def respond(self, ctx: RequestContext) -> None:
        return None  # the client owns its session id

    def sweep(self, now: float) -> None:
        """Drop the bindings unused for longer than the TTL, at most every sweep interval
        (on the request path: no task of its own)."""
        if now - self._swept < self.sweep_every:
            return
        self._swept = now
        cutoff = now - self.ttl
        for session in [s for s, b in self.bindings.items() if b.last_seen < cutoff]:
            del self.bindings[session]


def make_strategy(params: SessionAffinityParams, name: str) -> SessionStrategy:
    if params.strategy == "session_id":
        return SessionBindings(params.session_id_config, params.profile_name, name)
    return EncodedEndpointHeader(params.encoded_endpoint_header_config.header, params.profile_name)


def inherit_bindings(strategy: SessionStrategy, previous: object) -> str | None:
    """A reload keeps the session bindings of the instance it replaces (shared, not
    copied), when both remember sessions."""
    old = getattr(previous, "strategy", None)
    if not isinstance(strategy, SessionBindings):
        return None
    if not isinstance(old, SessionBindings):
        return "session bindings (the previous instance kept none)"
    strategy.bindings = old.bindings
    return None
