"""The registry: the only place that maps a plugin type name to its factory."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
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
    #: Modules the plugin imports when it is built rather than when its module is (heavy
    #: libraries a gateway without the plugin should not load): `preload` imports them.
    imports: tuple[str, ...] = ()


class Registry:
    """Type name -> PluginSpec. A plugin class declares its type with `@register(TYPE,
    Params)`; the composition root (`heimdall_proxy.plugins.builtins`, or a test) adds the
    classes it wants with `add`. The framework itself knows no plugin."""

    def __init__(self) -> None:
        self._specs: dict[str, PluginSpec] = {}

    def add(self, *classes: type) -> Registry:
        """Add declared plugin classes (each with its aliases). Returns self."""
        for cls in classes:
            specs: tuple[PluginSpec, ...] | None = cls.__dict__.get(_SPECS)
            if specs is None:
                raise ValueError(f"{cls.__qualname__} is not declared with @register")
            for spec in specs:
                self._put(spec)
        return self

    def register(
        self,
        type_name: str,
        params: type[PluginParams] = NoParams,
        *,
        feature_gate: str | None = None,
        aliases: tuple[str, ...] = (),
    ) -> Callable[[T], T]:
        """Register a factory under `type_name` (and `aliases`) directly."""

        def decorator(factory: T) -> T:
            for name in (type_name, *aliases):
                self._put(PluginSpec(name, factory, params, feature_gate))  # type: ignore[arg-type]
            return factory

        return decorator

    def _put(self, spec: PluginSpec) -> None:
        if spec.type_name in self._specs:
            raise ValueError(f"plugin type {spec.type_name!r} registered twice")
        self._specs[spec.type_name] = spec

    def get(self, type_name: str) -> PluginSpec | None:
        return self._specs.get(type_name)

    def preload(self, type_names: Iterable[str]) -> None:
        """Import what building plugins of these types will import. A config reload runs it
        in a thread first, so building the plugins on the event loop does not stall it
        (a CEL environment, say)."""
        for name in type_names:
            spec = self._specs.get(name)
            for module in spec.imports if spec is not None else ():
                importlib.import_module(module)

    def types(self) -> list[str]:
        return sorted(self._specs)

    def __iter__(self) -> Iterator[PluginSpec]:
        return iter(self._specs.values())

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._specs


_SPECS = "__plugin_specs__"


def register(
    type_name: str,
    params: type[PluginParams] = NoParams,
    *,
    feature_gate: str | None = None,
    aliases: tuple[str, ...] = (),
    imports: tuple[str, ...] = (),
) -> Callable[[T], T]:
    """Declare a plugin class: its type name (and aliases), parameter model, feature gate and
    the modules it imports when built (`PluginSpec.imports`). Declaring registers nothing;
    `Registry.add` does, in the composition root."""

    def decorator(cls: T) -> T:
        specs = tuple(
            PluginSpec(name, cls, params, feature_gate, imports)  # type: ignore[arg-type]
            for name in (type_name, *aliases)
        )
        setattr(cls, _SPECS, specs)
        return cls

    return decorator
