"""The registry: the only place that maps a plugin type name to its factory."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from heimdall_proxy.framework.params import NoParams, PluginParams

if TYPE_CHECKING:
    from heimdall_proxy.framework.handle import PluginHandle

#: A factory builds a plugin from its instance name, validated parameters and the handle.
Factory = Callable[[str, Any, "PluginHandle"], object]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PluginSpec:
    type_name: str
    factory: Factory
    params: type[PluginParams]
    #: Feature gate the plugin needs (e.g. "prepareDataPlugins"); None when ungated.
    feature_gate: str | None = None


class Registry:
    """Type name -> PluginSpec. Plugins register themselves at import time with
    `@register(TYPE, Params)` on their class (the class is the factory)."""

    def __init__(self) -> None:
        self._specs: dict[str, PluginSpec] = {}

    def register(
        self,
        type_name: str,
        params: type[PluginParams] = NoParams,
        *,
        feature_gate: str | None = None,
        aliases: tuple[str, ...] = (),
    ) -> Callable[[T], T]:
        def decorator(factory: T) -> T:
            for name in (type_name, *aliases):
                if name in self._specs:
                    raise ValueError(f"plugin type {name!r} registered twice")
                self._specs[name] = PluginSpec(name, factory, params, feature_gate)  # type: ignore[arg-type]
            return factory

        return decorator

    def get(self, type_name: str) -> PluginSpec | None:
        return self._specs.get(type_name)

    def types(self) -> list[str]:
        return sorted(self._specs)

    def __iter__(self) -> Iterator[PluginSpec]:
        return iter(self._specs.values())

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._specs


#: The built-in registry. It holds types, not state: instances live in the Gateway.
REGISTRY = Registry()
register = REGISTRY.register


def load_builtin_plugins() -> Registry:
    """Import every built-in plugin module so each registers itself; returns REGISTRY."""
    importlib.import_module("heimdall_proxy.plugins")
    return REGISTRY
