"""`heimdall-proxy check-config FILE`: validate a config exactly as `serve` would and print
the plugins and profiles it resolves to."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from heimdall_proxy.cli.args import verbosity
from heimdall_proxy.config.gateway import (
    ConfigError,
    GatewayConfig,
    PluginConfig,
    load_config,
    require_endpoints,
)
from heimdall_proxy.config.options import ServerOptions

if TYPE_CHECKING:
    from heimdall_proxy.config.build import PluginSet


def add_parser(sub: Any) -> None:
    check = sub.add_parser("check-config", help="validate a config and print the profiles")
    check.add_argument("config")
    check.add_argument("-v", "--v", dest="verbosity", type=verbosity, default=0)


def validate(config: GatewayConfig, options: ServerOptions) -> PluginSet:
    """Build the config's plugins exactly as `serve` does, without a gateway around them.
    Raises ConfigError."""
    from heimdall_proxy.config.build import build_plugins
    from heimdall_proxy.datalayer.pool import EndpointPool
    from heimdall_proxy.framework.handle import PluginHandle
    from heimdall_proxy.plugins.builtins import load_builtin_plugins

    handle = PluginHandle(
        pool=EndpointPool(config.endpoints),
        feature_gates=frozenset(config.epp.feature_gates),
        kubernetes=config.discovery.kubernetes is not None,
    )
    extra = [PluginConfig(type="response-header-handler")] if options.response_header else []
    return build_plugins(config.epp, load_builtin_plugins(), handle, extra=extra)


def check_config(path: str) -> int:
    """Validate like `serve` does and print the resolved plugins and profiles."""
    try:
        config = load_config(path)
        pset = validate(config, ServerOptions())
        require_endpoints(config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    print(describe(config, pset))
    return 0


def describe(cfg: GatewayConfig, pset: PluginSet) -> str:
    from heimdall_proxy.framework.plugins import extension_points

    out = [f"config OK: {cfg.source}"]
    out.append(f"feature gates: {', '.join(cfg.epp.feature_gates) or '(none)'}")
    k8s = cfg.discovery.kubernetes
    if k8s is not None:
        where = f"namespace {k8s.namespace!r}" if k8s.namespace else "all namespaces"
        out.append(
            f"discovery: kubernetes pods {k8s.label_selector()} in {where}, port {k8s.target_port}"
        )
    out.append("endpoints:")
    for ep in cfg.endpoints:
        labels = ", ".join(f"{k}={v}" for k, v in ep.labels.items())
        out.append(f"  {ep.name}  {ep.url}" + (f"  [{labels}]" if labels else ""))
    out.append("plugins:")
    for name, plugin in pset.plugins.items():
        params = getattr(plugin, "params", None)
        shown = params.model_dump(by_alias=True, exclude_none=True) if params is not None else {}
        out.append(
            f"  {name} (type {getattr(plugin, 'type', '?')}): {', '.join(extension_points(plugin))}"
            + (f"  {shown}" if shown else "")
        )
    for name, gate in pset.skipped.items():
        out.append(f"  {name}: skipped, feature gate {gate!r} not enabled")
    if pset.data_sources:
        out.append("data sources:")
        for wired in pset.data_sources:
            extractors = ", ".join(name for name, _ in wired.extractors)
            out.append(f"  {wired.name} -> {extractors}")
    suffix = " (default)" if pset.handler_defaulted else ""
    out.append(f"profile handler: {pset.handler_name}{suffix}")
    out.append("scheduling profiles:")
    for prof in pset.resolved_profiles:
        out.append(f"  {prof.name}:")
        out.append(f"    filters: {', '.join(prof.filters) or '(none)'}")
        scorers = ", ".join(f"{n} (weight {w:g})" for n, w in prof.scorers)
        out.append(f"    scorers: {scorers or '(none)'}")
        out.append(f"    picker:  {prof.picker}" + (" (default)" if prof.picker_defaulted else ""))
    return "\n".join(out)
