"""The YAML config: Heimdall's EndpointPickerConfig (at the top level, or under `config:` as in a
heimdall-values.yaml) plus the gateway's own `endpoints:` list."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from heimdall_proxy.config.discovery import DiscoveryConfig
from heimdall_proxy.config.flow import FlowControlConfig, ObjectiveConfig, SaturationDetectorConfig
from heimdall_proxy.framework.params import Duration, PluginParams

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """An invalid config; the message names the file, plugin, profile or field at fault."""


def _known_keys(model: type[BaseModel]) -> set[str]:
    known = set(model.model_fields)
    known.update(f.alias for f in model.model_fields.values() if f.alias)
    return known


def warn_unknown_keys(
    where: str, keys: Iterable[Any], known: Iterable[str], hint: str = ""
) -> None:
    """One warning for keys a config section has but nothing reads (a typo, or a field in
    the wrong place), with the closest known key when one is near."""
    choices = sorted(known)
    for key in keys:
        close = difflib.get_close_matches(str(key), choices, n=1, cutoff=0.75)
        log.warning(
            "%s: unknown key %r ignored%s%s",
            where,
            key,
            f" (did you mean {close[0]!r}?)" if close else "",
            hint,
        )


class _Model(BaseModel):
    """A config section: keys it does not know are ignored with a warning naming the
    section (`_section`), never silently."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @classmethod
    def _section(cls, data: Mapping[Any, Any]) -> tuple[str, str]:
        """How a warning names a section like `data`, and a hint to add."""
        return cls.__name__, ""

    @model_validator(mode="before")
    @classmethod
    def _unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            known = _known_keys(cls)
            unknown = [k for k in data if k not in known]
            if unknown:
                where, hint = cls._section(data)
                warn_unknown_keys(where, unknown, known, hint)
        return data


class PluginConfig(_Model):
    type: str
    name: str | None = None
    parameters: dict[str, Any] | None = None

    @classmethod
    def _section(cls, data: Mapping[Any, Any]) -> tuple[str, str]:
        name = data.get("name") or data.get("type")
        hint = (
            "; a weight goes on the plugin's pluginRef in a scheduling profile"
            if "weight" in data
            else ""
        )
        return f"plugin {name!r}", hint

    @property
    def instance_name(self) -> str:
        return self.name or self.type


class ProfilePluginRef(_Model):
    plugin_ref: str = Field(alias="pluginRef")
    weight: float | None = None


class SchedulingProfileConfig(_Model):
    name: str
    plugins: list[ProfilePluginRef] = Field(default_factory=list)


class ExtractorRef(_Model):
    plugin_ref: str = Field(alias="pluginRef")


class DataSourceConfig(_Model):
    plugin_ref: str = Field(alias="pluginRef")
    extractors: list[ExtractorRef] = Field(default_factory=list)


class DataConfig(_Model):
    """llm-d's `dataLayer` section (`data` before llm-d renamed it; both are read)."""

    #: llm-d: false stops it adding metrics-data-source with core-metrics-extractor. Here the
    #: pods' metrics are scraped whatever it says (config/build.py warns).
    inject_defaults: bool | None = Field(default=None, alias="injectDefaults")
    sources: list[DataSourceConfig] = Field(default_factory=list)


class RequestHandlerConfig(_Model):
    #: The parsers in force, in order; absent: llm-d's default list (config/defaults.py).
    parsers: list[ProfilePluginRef] | None = None


class EndpointPickerConfig(_Model):
    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    feature_gates: list[str] = Field(default_factory=list, alias="featureGates")
    plugins: list[PluginConfig] = Field(default_factory=list)
    scheduling_profiles: list[SchedulingProfileConfig] = Field(
        default_factory=list, alias="schedulingProfiles"
    )
    #: `dataLayer` (llm-d's name) or `data` (its older name): read through `data_layer`.
    data: DataConfig | None = None
    data_layer_section: DataConfig | None = Field(default=None, alias="dataLayer")
    request_handler: RequestHandlerConfig | None = Field(default=None, alias="requestHandler")
    flow_control: FlowControlConfig | None = Field(default=None, alias="flowControl")
    #: Deprecated in llm-d in favour of flowControl.saturationDetector; GIE's older EPP held
    #: the utilization parameters here directly. Both shapes are read.
    saturation_detector: SaturationDetectorConfig | None = Field(
        default=None, alias="saturationDetector"
    )

    @property
    def data_layer(self) -> DataConfig | None:
        """The data-layer section, under whichever of its two names it was given."""
        return self.data_layer_section or self.data

    @model_validator(mode="after")
    def _one_data_layer(self) -> EndpointPickerConfig:
        if self.data is not None and self.data_layer_section is not None:
            raise ValueError(
                "dataLayer and data are the same section (data is its older name): give one"
            )
        return self

    @property
    def detector_config(self) -> SaturationDetectorConfig | None:
        """The saturation detector section in force (flowControl's wins, as in llm-d)."""
        nested = self.flow_control.saturation_detector if self.flow_control else None
        return nested or self.saturation_detector

    @field_validator("feature_gates", mode="before")
    @classmethod
    def _gates(cls, value: Any) -> Any:
        # Accept both the list form and a {gate: true} map.
        if isinstance(value, Mapping):
            return [str(k) for k, v in value.items() if v]
        return [] if value is None else value


class EndpointConfig(_Model):
    name: str
    url: str
    labels: dict[str, str] = Field(default_factory=dict)
    kv_events: str | None = Field(default=None, alias="kvEvents")
    #: Static model list; when set, the pod's /v1/models is not polled.
    models: list[str] | None = None

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): str(v) for k, v in value.items()}
        return {} if value is None else value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host[:port], got {value!r}")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(f"bad port in url {value!r}") from exc
        return value.rstrip("/")

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)


#: The EndpointPickerConfig's keys, as its model spells them (one list: a key added to the
#: model is read, never warned about as unknown).
_EPP_KEYS = {f.alias or name for name, f in EndpointPickerConfig.model_fields.items()}
#: The gateway's own keys, read at the top level or beside the EPP config.
_GATEWAY_KEYS = ("config", "endpoints", "outlierDetection", "objectives", "discovery")


class OutlierDetectionConfig(PluginParams):
    """Passive outlier ejection (ours, with Envoy's semantics): a pod whose last
    `consecutiveFailures` attempts all failed (connect or read error, 5xx, 429) leaves the
    candidates for `baseEjectionTime` x the number of times it was ejected (at most
    `maxEjectionTime`); then it is tried again, and one more failure ejects it again.
    `consecutiveFailures` 0 turns ejection off. A 500 counts only once another pod served
    the same request (resilience/outliers.py: a request failing on two pods is its own fault)."""

    consecutive_failures: int = Field(default=5, ge=0)
    base_ejection_time: Duration = 30.0
    max_ejection_time: Duration = 300.0


class GatewayConfig(_Model):
    epp: EndpointPickerConfig
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    outlier_detection: OutlierDetectionConfig = Field(
        default_factory=OutlierDetectionConfig, alias="outlierDetection"
    )
    objectives: list[ObjectiveConfig] = Field(default_factory=list)
    #: Pods found at run time, beside `endpoints` (discovery.py).
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig)
    source: str = "<memory>"


def _format_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def _llm_d_values_config(router: Mapping[str, Any], source: str) -> Any:
    """The EndpointPickerConfig in llm-d's Helm values (`router.epp`): the entry of
    `pluginsCustomConfig` that `pluginsConfigFile` names (the only one when it names none)."""
    epp = router.get("epp")
    custom = epp.get("pluginsCustomConfig") if isinstance(epp, Mapping) else None
    if not isinstance(custom, Mapping) or not custom:
        raise ConfigError(
            f"{source}: llm-d values (`router:`) without router.epp.pluginsCustomConfig; "
            "give the EndpointPickerConfig itself, or under `config:`"
        )
    wanted = epp.get("pluginsConfigFile") if isinstance(epp, Mapping) else None
    if wanted is None and len(custom) == 1:
        wanted = next(iter(custom))
    if wanted not in custom:
        raise ConfigError(
            f"{source}: router.epp.pluginsConfigFile {wanted!r} is not a key of "
            f"pluginsCustomConfig ({', '.join(map(str, custom))})"
        )
    return custom[wanted]


def parse_config(doc: Any, source: str = "<memory>") -> GatewayConfig:
    """Validate a parsed YAML document. Raises ConfigError."""
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: the config must be a YAML mapping")
    epp_doc: Any = doc
    if "config" not in doc and isinstance(doc.get("router"), Mapping):
        rest = {k: v for k, v in doc.items() if k != "router"}  # `router` is read, not ignored
        doc = {**rest, "config": _llm_d_values_config(doc["router"], source)}
    if "config" in doc:
        epp_doc = doc["config"]
        if isinstance(epp_doc, str):  # Helm values often embed the EPP config as a string
            try:
                epp_doc = yaml.safe_load(epp_doc)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{source}: `config:` is not valid YAML: {exc}") from exc
        if not isinstance(epp_doc, Mapping):
            raise ConfigError(f"{source}: `config:` must be a mapping")
        ignored = sorted(k for k in doc if k not in _GATEWAY_KEYS)
        if ignored:
            log.info("ignoring Helm keys %s in %s", ", ".join(ignored), source)
    epp_doc = dict(epp_doc)
    known = _EPP_KEYS.union(_GATEWAY_KEYS)
    unknown = [k for k in epp_doc if k not in known]
    if unknown:  # beside the EPP keys: a typo (`schedulingProfile:`) would change routing
        section = "config:" if "config" in doc else "top level"
        warn_unknown_keys(f"{source} ({section})", unknown, known)
    endpoints_doc = doc.get("endpoints", epp_doc.get("endpoints")) or []
    try:
        epp = EndpointPickerConfig.model_validate(
            {k: v for k, v in epp_doc.items() if k in _EPP_KEYS}
        )
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_format_validation(exc)}") from exc
    if not isinstance(endpoints_doc, list):
        raise ConfigError(f"{source}: endpoints must be a list")
    endpoints = _validate_items(EndpointConfig, endpoints_doc, "endpoints", source)
    seen: set[str] = set()
    for ep in endpoints:
        if ep.name in seen:
            raise ConfigError(f"{source}: duplicate endpoint name {ep.name!r}")
        seen.add(ep.name)
    try:
        outliers = OutlierDetectionConfig.model_validate(
            doc.get("outlierDetection", epp_doc.get("outlierDetection")) or {}
        )
    except ValidationError as exc:
        raise ConfigError(f"{source}: outlierDetection: {_format_validation(exc)}") from exc
    objectives = _objectives(doc.get("objectives", epp_doc.get("objectives")) or [], source)
    try:
        discovery = DiscoveryConfig.model_validate(
            doc.get("discovery", epp_doc.get("discovery")) or {}
        )
    except ValidationError as exc:
        raise ConfigError(f"{source}: discovery: {_format_validation(exc)}") from exc
    return GatewayConfig(
        epp=epp,
        endpoints=endpoints,
        outlierDetection=outliers,
        objectives=objectives,
        discovery=discovery,
        source=source,
    )


def require_endpoints(config: GatewayConfig) -> None:
    """A config the gateway serves from a file must name pods (or a discovery source): an
    empty list, from a templating mistake say, is an error, never simulated pods serving
    fake answers. Raises ConfigError."""
    if not config.endpoints and config.discovery.kubernetes is None:
        raise ConfigError(
            f"{config.source}: no endpoints and no discovery: there is no pod to route to "
            "(`heimdall-proxy demo` runs simulated pods)"
        )


M = TypeVar("M", bound=BaseModel)


def _validate_items(model: type[M], items: list[Any], where: str, source: str) -> list[M]:
    """Each item of a config list validated; an error names the list and the index."""
    out: list[M] = []
    for i, item in enumerate(items):
        try:
            out.append(model.model_validate(item))
        except ValidationError as exc:
            raise ConfigError(f"{source}: {where}[{i}]: {_format_validation(exc)}") from exc
    return out


def _objectives(doc: Any, source: str) -> list[ObjectiveConfig]:
    if not isinstance(doc, list):
        raise ConfigError(f"{source}: objectives must be a list of {{name, priority}}")
    out = _validate_items(ObjectiveConfig, doc, "objectives", source)
    names = [o.name for o in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{source}: objectives: {', '.join(dup)} listed twice")
    return out


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a config file. Raises ConfigError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML: {exc}") from exc
    return parse_config(doc, str(p))
