"""Builds the flow controller from the config: the saturation detector in force, each band's
policies, the objectives. Config errors surface here, before a port is bound."""

from __future__ import annotations

import logging

from heimdall_proxy.config.build import PluginSet, instantiate
from heimdall_proxy.config.defaults import (
    DEFAULT_DETECTOR,
    DEFAULT_FAIRNESS,
    DEFAULT_ORDERING,
    DEFAULT_USAGE_LIMIT,
)
from heimdall_proxy.config.flow import FLOW_CONTROL_GATE, FlowControlConfig, PriorityBandConfig
from heimdall_proxy.config.gateway import ConfigError, GatewayConfig, PluginConfig
from heimdall_proxy.flowcontrol.controller import FlowController
from heimdall_proxy.flowcontrol.metrics import FlowMetrics
from heimdall_proxy.flowcontrol.objectives import Objectives
from heimdall_proxy.framework.flowcontrol import (
    FairnessPolicy,
    OrderingPolicy,
    SaturationDetector,
    UsageLimitPolicy,
)
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.registry import Registry

log = logging.getLogger(__name__)


def _declared(pset: PluginSet, ref: str, proto: type, what: str) -> object:
    plugin = pset.plugins.get(ref)
    if plugin is None:
        why = (
            f" (skipped: feature gate {pset.skipped[ref]!r} is off)" if ref in pset.skipped else ""
        )
        raise ConfigError(f"{what}: pluginRef {ref!r} names no declared plugin{why}")
    if not isinstance(plugin, proto):
        kind = getattr(plugin, "type", "?")
        raise ConfigError(f"{what}: plugin {ref!r} (type {kind!r}) is not a {proto.__name__}")
    return plugin


def build_detector(
    config: GatewayConfig, pset: PluginSet, registry: Registry, handle: PluginHandle
) -> SaturationDetector:
    section = config.epp.detector_config
    if section is not None and section.plugin_ref:
        found = _declared(pset, section.plugin_ref, SaturationDetector, "saturationDetector")
        return found  # type: ignore[return-value]
    params = section.detector_params() if section is not None else {}
    if not params and isinstance(pset.plugins.get(DEFAULT_DETECTOR), SaturationDetector):
        return pset.plugins[DEFAULT_DETECTOR]  # type: ignore[return-value]
    cfg = PluginConfig(type=DEFAULT_DETECTOR, parameters=params)
    detector = instantiate(registry, cfg, handle, name="saturationDetector")
    assert isinstance(detector, SaturationDetector)
    return detector


def build_flow(
    config: GatewayConfig,
    pset: PluginSet,
    registry: Registry,
    handle: PluginHandle,
    metrics: FlowMetrics,
) -> FlowController:
    epp = config.epp
    queues = FLOW_CONTROL_GATE in epp.feature_gates
    flow_cfg = epp.flow_control
    # its saturationDetector is honoured without the gate (the shedding uses it), as in llm-d
    if flow_cfg is not None and not queues and flow_cfg.model_fields_set - {"saturation_detector"}:
        log.warning(
            "flowControl: is set but the %r feature gate is off: no gateway queues "
            "(a saturated pool only sheds sheddable requests); only its saturationDetector "
            "is used",
            FLOW_CONTROL_GATE,
        )
    if queues and flow_cfg is None:
        flow_cfg = FlowControlConfig()
    if flow_cfg is not None and queues and flow_cfg.enable_eviction:
        log.warning("flowControl.enableEviction is not supported; in-flight requests stay")
    defaults: dict[str, object] = {}

    def policy(ref: str, default_type: str, proto: type, what: str) -> object:
        if ref:
            return _declared(pset, ref, proto, what)
        if default_type not in defaults:
            found = pset.plugins.get(default_type)
            defaults[default_type] = (
                found
                if isinstance(found, proto)
                else instantiate(registry, PluginConfig(type=default_type), handle)
            )
        return defaults[default_type]

    def policies(band: PriorityBandConfig) -> tuple[FairnessPolicy, OrderingPolicy]:
        where = f"flowControl band {band.priority}"
        fairness = policy(band.fairness_policy_ref, DEFAULT_FAIRNESS, FairnessPolicy, where)
        ordering = policy(band.ordering_policy_ref, DEFAULT_ORDERING, OrderingPolicy, where)
        return fairness, ordering  # type: ignore[return-value]

    if queues and flow_cfg is not None:  # resolve every named policy now: errors before start
        templates = [flow_cfg.default_priority_band, flow_cfg.default_negative_priority_band]
        for band in [*flow_cfg.priority_bands, *templates]:
            if band is not None:
                policies(band)
    usage_limit: UsageLimitPolicy | None = None
    if queues and flow_cfg is not None:
        # llm-d's default is a static-usage-limit-policy at 1.0 (no gating), which is what
        # the controller does without one; a plugin of that name overrides it, as in llm-d
        ref = flow_cfg.usage_limit_policy_plugin_ref or (
            DEFAULT_USAGE_LIMIT if DEFAULT_USAGE_LIMIT in pset.plugins else ""
        )
        if ref:
            what = "flowControl.usageLimitPolicyPluginRef"
            usage_limit = _declared(pset, ref, UsageLimitPolicy, what)  # type: ignore[assignment]
    return FlowController(
        build_detector(config, pset, registry, handle),
        handle.load,
        Objectives(config.objectives),
        flow_cfg if queues else None,
        policies,
        metrics,
        # with no queues and no sheddable objective, admission can never say no: skip it
        judge=queues or any(o.priority < 0 for o in config.objectives),
        usage_limit=usage_limit,
    )
