"""Builds plugin instances, scheduling profiles and the scheduler from an EndpointPickerConfig,
with the same defaults and checks as Heimdall."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

from heimdall_proxy.config.defaults import (
    DEFAULT_HANDLER,
    DEFAULT_PARSERS,
    DEFAULT_PICKER,
    MAX_SCORE_PICKER,
    SINGLE_PROFILE_HANDLER,
    add_default_deciders,
    add_prefix_producers,
    default_profiles,
    with_default_plugins,
)
from heimdall_proxy.config.gateway import (
    ConfigError,
    DataConfig,
    EndpointPickerConfig,
    PluginConfig,
    RequestHandlerConfig,
    SchedulingProfileConfig,
)
from heimdall_proxy.datalayer.refresher import WiredSource
from heimdall_proxy.framework.handle import PluginHandle, PluginLookupError
from heimdall_proxy.framework.plugins import (
    ENDPOINT_EVENTS,
    Admitter,
    ChecksPeers,
    DataExtractor,
    DataSource,
    EndpointExtractor,
    Filter,
    Lifecycle,
    Parser,
    Picker,
    PrepareData,
    PreRequest,
    Producer,
    ProfileHandler,
    RequestHeader,
    ResponseComplete,
    ResponseReceived,
    ResponsesStoreAPI,
    ResponseStreaming,
    Scorer,
    extension_points,
)
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.framework.scheduler import (
    Scheduler,
    SchedulerProfile,
    TimerFactory,
    WeightedScorer,
    no_timers,
)
from heimdall_proxy.requesthandling.parsers import ParserTable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ResolvedProfile:
    name: str
    filters: list[str]
    scorers: list[tuple[str, float]]
    picker: str
    picker_defaulted: bool


@dataclass(slots=True)
class PluginSet:
    """Every plugin instance, by extension point, in declaration order."""

    plugins: dict[str, object]
    scheduler: Scheduler
    resolved_profiles: list[ResolvedProfile]
    handler_name: str
    handler_defaulted: bool
    skipped: dict[str, str] = field(default_factory=dict)
    request_header: list[RequestHeader] = field(default_factory=list)
    prepare_data: list[PrepareData] = field(default_factory=list)
    producers: list[Producer] = field(default_factory=list)
    admitters: list[Admitter] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    response_received: list[ResponseReceived] = field(default_factory=list)
    response_streaming: list[ResponseStreaming] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)
    lifecycle: list[Lifecycle] = field(default_factory=list)
    #: The plugin serving GET/DELETE /v1/responses/{id}, if one is declared.
    responses_store: ResponsesStoreAPI | None = None
    #: Data-layer sources wired by the config's `data` field (each with >= 1 extractor).
    data_sources: list[WiredSource] = field(default_factory=list)
    #: The parsers of `requestHandler.parsers` (llm-d's defaults when it lists none).
    parsers: ParserTable = field(default_factory=lambda: ParserTable([]))


def _params_error(plugin: PluginConfig, exc: ValidationError) -> ConfigError:
    parts = []
    for err in exc.errors():
        # A model-level validator reports an empty loc: name the parameters as a whole.
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"parameters.{loc}: {err['msg']}" if loc else f"parameters: {err['msg']}")
    return ConfigError(
        f"plugin {plugin.instance_name!r} (type {plugin.type!r}): " + "; ".join(parts)
    )


def unknown_params(model: BaseModel, prefix: str = "") -> list[str]:
    """Names of the keys a parameter model kept as extras, nested ones as dotted paths
    (`storeConfig.inMemoryConfig.maxEntrys`), so a typo deep in a config is reported too."""
    found = [prefix + key for key in model.model_extra or {}]
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        path = f"{prefix}{info.alias or name}"
        children = value if isinstance(value, list) else [value]
        for i, child in enumerate(children):
            if isinstance(child, BaseModel):
                where = f"{path}[{i}]" if isinstance(value, list) else path
                found.extend(unknown_params(child, where + "."))
    return found


def instantiate(
    registry: Registry, cfg: PluginConfig, handle: PluginHandle, name: str | None = None
) -> object:
    """Validate one plugin's parameters and build it. Raises ConfigError."""
    spec = registry.get(cfg.type)
    name = name or cfg.instance_name
    if spec is None:
        raise ConfigError(
            f"plugin {name!r}: unknown plugin type {cfg.type!r} "
            f"(known types: {', '.join(registry.types())})"
        )
    try:
        params = spec.params.model_validate(cfg.parameters or {})
    except ValidationError as exc:
        raise _params_error(cfg, exc) from exc
    unknown = unknown_params(params)
    if unknown:
        log.warning(
            "plugin %r (type %r): ignoring unknown parameters %s",
            name,
            cfg.type,
            ", ".join(sorted(unknown)),
        )
    try:
        plugin = spec.factory(name, params, handle)
    except (ConfigError, PluginLookupError, ValueError) as exc:
        raise ConfigError(f"plugin {name!r} (type {cfg.type!r}): {exc}") from exc
    return plugin


def build_plugins(
    epp: EndpointPickerConfig,
    registry: Registry,
    handle: PluginHandle,
    timers: TimerFactory = no_timers,
    extra: list[PluginConfig] | None = None,
) -> PluginSet:
    """Build everything a config declares, in phases: defaults -> instantiate -> profiles ->
    profile handler (which validates the profiles) -> extension points. `extra` plugins
    (added by command-line flags) are appended unless one of the same type is already
    declared. Raises ConfigError."""
    epp = add_prefix_producers(add_default_deciders(with_default_plugins(epp)))
    plugins, skipped = instantiate_all(epp, registry, handle, extra or [])
    check_peers(plugins)
    profile_cfgs = list(epp.scheduling_profiles) or default_profiles(
        [n for n, p in plugins.items() if _in_profile(p)]
    )
    profiles, resolved = build_profiles(profile_cfgs, plugins, skipped, registry, handle, timers)
    handler_name, handler, handler_defaulted = build_handler(plugins, profiles, registry, handle)
    pset = PluginSet(
        plugins=plugins,
        scheduler=Scheduler(handler, profiles, timers),
        resolved_profiles=resolved,
        handler_name=handler_name,
        handler_defaulted=handler_defaulted,
        skipped=skipped,
        responses_store=_one_store(plugins),
        data_sources=wire_data_layer(
            epp.data_layer, plugins, skipped, "data" if epp.data is not None else "dataLayer"
        ),
        parsers=wire_parsers(epp.request_handler, plugins, registry, handle),
    )
    _sort_extension_points(pset)
    return pset


#: Profile handlers' type names end so (single-, disagg-, pd-, data-parallel-...).
PROFILE_HANDLER_SUFFIX = "-profile-handler"


def instantiate_all(
    epp: EndpointPickerConfig, registry: Registry, handle: PluginHandle, extra: list[PluginConfig]
) -> tuple[dict[str, object], dict[str, str]]:
    """Phase 1: every declared plugin, in order (each can look up the ones before it through
    the handle), profile handlers last: they look up the deciders and handlers they name,
    which llm-d's configs may declare after them. Returns the plugins by name and the ones
    skipped for a disabled feature gate (name -> gate)."""
    plugins: dict[str, object] = {}
    skipped: dict[str, str] = {}
    gates = handle.feature_gates
    declared = list(epp.plugins)
    declared_types = {p.type for p in declared}
    declared.extend(p for p in extra if p.type not in declared_types)
    declared.sort(key=lambda p: p.type.endswith(PROFILE_HANDLER_SUFFIX))  # stable
    names = {cfg.instance_name for cfg in declared}
    waiting: list[tuple[PluginConfig, ConfigError]] = []
    for cfg in declared:
        name = cfg.instance_name
        if name in plugins or name in skipped or any(w.instance_name == name for w, _ in waiting):
            raise ConfigError(f"duplicate plugin name {name!r}")
        spec = registry.get(cfg.type)
        if spec is not None and spec.feature_gate and spec.feature_gate not in gates:
            log.warning(
                "plugin %r (type %r) needs feature gate %r, which is not enabled; skipping it",
                name,
                cfg.type,
                spec.feature_gate,
            )
            skipped[name] = spec.feature_gate
            continue
        _build_one(cfg, registry, handle, plugins, names, waiting)
    # Those that named a plugin declared after them, once it is built (llm-d resolves
    # references whatever the order): rounds until one builds nothing new.
    while waiting:
        rounds, waiting = waiting, []
        for cfg, _ in rounds:
            _build_one(cfg, registry, handle, plugins, names, waiting)
        if len(waiting) == len(rounds):
            raise waiting[0][1]  # a circle, or a name that never gets built
    return plugins, skipped


def _build_one(
    cfg: PluginConfig,
    registry: Registry,
    handle: PluginHandle,
    plugins: dict[str, object],
    names: set[str],
    waiting: list[tuple[PluginConfig, ConfigError]],
) -> None:
    """Build `cfg` into `plugins`; when it names a declared plugin not built yet, it waits."""
    try:
        plugin = instantiate(registry, cfg, handle)
    except ConfigError as exc:
        missing = exc.__cause__
        if isinstance(missing, PluginLookupError) and missing.name in names:
            waiting.append((cfg, exc))
            return
        raise
    plugins[cfg.instance_name] = plugin
    handle.add(cfg.instance_name, plugin)


def check_peers(plugins: dict[str, object]) -> None:
    """Phase 1b: plugins that name other plugins check them, now that all are built."""
    for name, plugin in plugins.items():
        if isinstance(plugin, ChecksPeers):
            try:
                plugin.check_peers(plugins)
            except ValueError as exc:
                kind = getattr(plugin, "type", "?")
                raise ConfigError(f"plugin {name!r} (type {kind!r}): {exc}") from exc


def _in_profile(plugin: object) -> bool:
    return isinstance(plugin, Filter | Scorer | Picker) and not isinstance(plugin, ProfileHandler)


def build_profiles(
    profile_cfgs: list[SchedulingProfileConfig],
    plugins: dict[str, object],
    skipped: dict[str, str],
    registry: Registry,
    handle: PluginHandle,
    timers: TimerFactory,
) -> tuple[dict[str, SchedulerProfile], list[ResolvedProfile]]:
    """Phase 2: resolve each profile's pluginRefs into filters, weighted scorers and one
    picker (the default picker when it names none)."""
    profiles: dict[str, SchedulerProfile] = {}
    resolved: list[ResolvedProfile] = []
    for prof in profile_cfgs:
        if prof.name in profiles:
            raise ConfigError(f"duplicate scheduling profile name {prof.name!r}")
        profile, res = _build_profile(prof, plugins, skipped, registry, handle, timers)
        profiles[prof.name] = profile
        resolved.append(res)
    return profiles, resolved


def _build_profile(
    prof: SchedulingProfileConfig,
    plugins: dict[str, object],
    skipped: dict[str, str],
    registry: Registry,
    handle: PluginHandle,
    timers: TimerFactory,
) -> tuple[SchedulerProfile, ResolvedProfile]:
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    picker: Picker | None = None
    picker_name = ""
    res = ResolvedProfile(prof.name, [], [], "", False)
    for ref in prof.plugins:
        where = f"scheduling profile {prof.name!r}: pluginRef {ref.plugin_ref!r}"
        if ref.plugin_ref in skipped:
            raise ConfigError(
                f"{where} is skipped because feature gate {skipped[ref.plugin_ref]!r} "
                "is not enabled"
            )
        plugin = plugins.get(ref.plugin_ref)
        if plugin is None:
            raise ConfigError(f"{where} names no declared plugin")
        roles = 0
        if isinstance(plugin, Filter):
            filters.append(plugin)
            res.filters.append(ref.plugin_ref)
            roles += 1
        if isinstance(plugin, Scorer):
            weight = 1.0 if ref.weight is None else ref.weight
            if weight < 0:
                raise ConfigError(f"{where}: weight must be >= 0, got {weight}")
            scorers.append(WeightedScorer(plugin, weight))
            res.scorers.append((ref.plugin_ref, weight))
            roles += 1
        if isinstance(plugin, Picker):
            if picker is not None:
                raise ConfigError(
                    f"scheduling profile {prof.name!r} has two pickers: "
                    f"{picker_name!r} and {ref.plugin_ref!r}"
                )
            picker, picker_name = plugin, ref.plugin_ref
            roles += 1
        if roles == 0 and isinstance(plugin, Producer | Admitter):
            # llm-d's predicted-latency example lists its producer inside the profile; it is
            # bound by what it implements, as when listed in `plugins` only.
            log.debug("%s: a producer or admitter, run once per request, not per profile", where)
            continue
        if roles == 0 and isinstance(plugin, Parser | PreRequest | ResponseComplete):
            # llm-d's request-attribute-reporter test config lists its parser and reporter in
            # the profile; llm-d's profile takes what is a filter, scorer or picker and
            # leaves the rest to run by what it implements, as here.
            log.warning(
                "%s: plugin type %r is not a filter, scorer or picker (it is: %s); it runs by "
                "what it implements, not as part of the profile",
                where,
                getattr(plugin, "type", "?"),
                ", ".join(extension_points(plugin)),
            )
            continue
        if roles == 0:
            points = ", ".join(extension_points(plugin)) or "no scheduling extension point"
            raise ConfigError(
                f"{where}: plugin type {getattr(plugin, 'type', '?')!r} is not a filter, "
                f"scorer or picker (it is: {points}) and cannot be placed in a profile"
            )
        if ref.weight is not None and not isinstance(plugin, Scorer):
            log.warning("%s: weight ignored, the plugin is not a scorer", where)
    if picker is None:
        picker = instantiate(registry, DEFAULT_PICKER, handle, name=MAX_SCORE_PICKER)  # type: ignore[assignment]
        picker_name = MAX_SCORE_PICKER
        res.picker_defaulted = True
    assert picker is not None
    res.picker = picker_name
    return SchedulerProfile(prof.name, filters, scorers, picker, timers), res


def build_handler(
    plugins: dict[str, object],
    profiles: dict[str, SchedulerProfile],
    registry: Registry,
    handle: PluginHandle,
) -> tuple[str, ProfileHandler, bool]:
    """Phase 3: the one profile handler (the default one when none is declared), which then
    validates the profiles it is given (ProfileHandler.validate_profiles)."""
    handlers = [(n, p) for n, p in plugins.items() if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        raise ConfigError(
            "only one profile handler may be declared, found: "
            + ", ".join(f"{n!r}" for n, _ in handlers)
        )
    defaulted = not handlers
    if handlers:
        name, handler = handlers[0]
    else:
        if len(profiles) != 1:
            raise ConfigError(
                f"{len(profiles)} scheduling profiles are declared but no profile handler; "
                "declare one (e.g. disagg-profile-handler)"
            )
        name = SINGLE_PROFILE_HANDLER
        handler = instantiate(registry, DEFAULT_HANDLER, handle)  # type: ignore[assignment]
    try:
        handler.validate_profiles(profiles)
    except ValueError as exc:
        raise ConfigError(f"profile handler {name!r}: {exc}") from exc
    return name, handler, defaulted


def _one_store(plugins: dict[str, object]) -> ResponsesStoreAPI | None:
    stores = [(n, p) for n, p in plugins.items() if isinstance(p, ResponsesStoreAPI)]
    if len(stores) > 1:
        raise ConfigError(
            "only one responses store may be declared, found: "
            + ", ".join(f"{n!r}" for n, _ in stores)
        )
    return stores[0][1] if stores else None


def _sort_extension_points(pset: PluginSet) -> None:
    """Phase 4: each plugin under every request-path extension point it implements."""
    for plugin in pset.plugins.values():
        if isinstance(plugin, RequestHeader):
            pset.request_header.append(plugin)
        if isinstance(plugin, PrepareData):
            pset.prepare_data.append(plugin)
        if isinstance(plugin, Producer):
            pset.producers.append(plugin)
        if isinstance(plugin, Admitter):
            pset.admitters.append(plugin)
        if isinstance(plugin, PreRequest):
            pset.pre_request.append(plugin)
        if isinstance(plugin, ResponseReceived):
            pset.response_received.append(plugin)
        if isinstance(plugin, ResponseStreaming):
            pset.response_streaming.append(plugin)
        if isinstance(plugin, ResponseComplete):
            pset.response_complete.append(plugin)
        if isinstance(plugin, Lifecycle):
            pset.lifecycle.append(plugin)


def wire_parsers(
    handler: RequestHandlerConfig | None,
    plugins: dict[str, object],
    registry: Registry,
    handle: PluginHandle,
) -> ParserTable:
    """The `requestHandler.parsers` list resolved against the declared plugins, in order;
    without a list, llm-d's defaults (DEFAULT_PARSERS: a declared plugin of a default type
    serves, the others are made here). Raises ConfigError for a reference to no plugin or to
    one that is not a parser; a parser declared but not in force is warned about."""
    listed: list[tuple[str, Parser]] = []
    if handler is None or handler.parsers is None:
        by_type = {getattr(p, "type", None): (n, p) for n, p in reversed(plugins.items())}
        for type_name in DEFAULT_PARSERS:
            if type_name in by_type:
                name, parser = by_type[type_name]
            elif registry.get(type_name) is not None:  # a registry of tests' may lack it
                name = type_name
                parser = instantiate(registry, PluginConfig(type=type_name), handle)
            else:
                continue
            assert isinstance(parser, Parser)
            listed.append((name, parser))
    else:
        for i, ref in enumerate(handler.parsers):
            where = f"requestHandler.parsers[{i}]: pluginRef {ref.plugin_ref!r}"
            parser = plugins.get(ref.plugin_ref)
            if parser is None:
                raise ConfigError(f"{where} names no declared plugin")
            if not isinstance(parser, Parser):
                raise ConfigError(f"{where}: {_not_a(parser, 'parser')}")
            listed.append((ref.plugin_ref, parser))
    in_force = {name for name, _ in listed}
    for name, plugin in plugins.items():
        if name not in in_force and isinstance(plugin, Parser):
            log.warning(
                "parser %r is declared but not listed in requestHandler.parsers; it reads nothing",
                name,
            )
    return ParserTable(listed)


def wire_data_layer(
    data: DataConfig | None,
    plugins: dict[str, object],
    skipped: dict[str, str],
    section: str = "dataLayer",
) -> list[WiredSource]:
    """Resolve the config's `dataLayer.sources` (or `data.sources`) against the declared
    plugins. A reference to a plugin skipped for want of its feature gate is dropped with a
    warning (as the plugin itself is); any other wiring mistake is a ConfigError. A source
    left with no extractor is not polled (nothing would read its data)."""
    wired: list[WiredSource] = []
    referenced: set[str] = set()
    if data is not None and data.inject_defaults is False:
        log.warning(
            "dataLayer.injectDefaults: false is not honoured: the pods' metrics are scraped "
            "whatever the config says (the gateway's own gauges and detectors read them)"
        )
    for i, src in enumerate(data.sources if data is not None else []):
        ref = src.plugin_ref
        where = f"{section}.sources[{i}]: pluginRef {ref!r}"
        if ref in skipped:
            log.warning(
                "%s is skipped because feature gate %r is not enabled; the source is not polled",
                where,
                skipped[ref],
            )
            continue
        source = plugins.get(ref)
        if source is None:
            raise ConfigError(f"{where} names no declared plugin")
        if not isinstance(source, DataSource):
            raise ConfigError(f"{where}: {_not_a(source, 'data source')}")
        if ref in referenced:
            raise ConfigError(f"{where}: the source is listed twice in {section}.sources")
        referenced.add(ref)
        extractors: list[tuple[str, DataExtractor]] = []
        for j, ext_cfg in enumerate(src.extractors):
            ext_ref = ext_cfg.plugin_ref
            ext_where = f"{section}.sources[{i}].extractors[{j}]: pluginRef {ext_ref!r}"
            if ext_ref in skipped:
                log.warning(
                    "%s is skipped because feature gate %r is not enabled",
                    ext_where,
                    skipped[ext_ref],
                )
                continue
            extractor = plugins.get(ext_ref)
            if extractor is None:
                raise ConfigError(f"{ext_where} names no declared plugin")
            if source.output_type == ENDPOINT_EVENTS:
                if not isinstance(extractor, EndpointExtractor):
                    points = ", ".join(extension_points(extractor)) or "no extension point"
                    raise ConfigError(
                        f"{ext_where}: plugin type {getattr(extractor, 'type', '?')!r} is not "
                        f"an endpoint extractor (it is: {points}); an "
                        f"endpoint-notification-source tells its extractors of pods joining "
                        f"and leaving"
                    )
                extractors.append((ext_ref, extractor))  # type: ignore[arg-type]
                referenced.add(ext_ref)
                continue
            if not isinstance(extractor, DataExtractor):
                raise ConfigError(f"{ext_where}: {_not_a(extractor, 'data extractor')}")
            if extractor.input_type != source.output_type:
                raise ConfigError(
                    f"{ext_where}: the extractor reads {extractor.input_type!r} data but source "
                    f"{ref!r} produces {source.output_type!r}"
                )
            if any(name == ext_ref for name, _ in extractors):
                raise ConfigError(f"{ext_where}: the extractor is listed twice for this source")
            extractors.append((ext_ref, extractor))
            referenced.add(ext_ref)
            wants = getattr(source, "wants", None)
            if wants is not None:  # a page source parses only what its extractors read
                wants(frozenset(getattr(extractor, "metric_families", ())))
        if not extractors:
            log.warning(
                "%s has no extractor; nothing would read its data, so it is not polled", where
            )
            continue
        wired.append(WiredSource(ref, source, extractors))
    for name, plugin in plugins.items():
        if name not in referenced and isinstance(plugin, DataSource | DataExtractor):
            log.warning(
                "data-layer plugin %r is declared but not wired in %s.sources; it does nothing",
                name,
                section,
            )
    return wired


def _not_a(plugin: object, what: str) -> str:
    points = ", ".join(extension_points(plugin)) or "no extension point"
    return f"plugin type {getattr(plugin, 'type', '?')!r} is not a {what} (it is: {points})"
