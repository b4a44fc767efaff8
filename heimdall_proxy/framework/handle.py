"""What a plugin receives at construction besides its parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.popularity import Popularities
from heimdall_proxy.framework.types import Endpoint


class EndpointSource(Protocol):
    """Read-only view of the live endpoint pool."""

    def endpoints(self) -> list[Endpoint]: ...

    def get(self, name: str) -> Endpoint | None: ...


class PluginLookupError(LookupError):
    """A plugin referenced another plugin that is not built (yet): `name` is the one it
    asked for."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name


@dataclass(slots=True)
class PluginHandle:
    """Handed to every plugin factory: the pool, feature gates, the gateway's state owners
    (the in-flight ledger with its learned queue prices, the prefix popularity), and the
    plugins built so far (references resolve at initialisation; the loader builds a plugin
    after the ones it names, as llm-d does, whatever the order of declaration). A plugin
    reads the owners' data through these and keeps no copy of its own."""

    pool: EndpointSource
    feature_gates: frozenset[str] = frozenset()
    #: The gateway's in-flight ledger (saturation detectors read it), and the queue price
    #: learned from it: `load.queue_price(seconds_per_token).price(pod)`.
    load: InFlightLoad = field(default_factory=InFlightLoad)
    #: How many recent requests shared each prefix: `popularity.of(half_life).count(key)`
    #: (framework/popularity.py). The gateway's, carried over reloads.
    popularity: Popularities = field(default_factory=Popularities)
    #: The pods are discovered from a Kubernetes cluster (`discovery.kubernetes`): plugins
    #: that watch cluster objects need it.
    kubernetes: bool = False
    _plugins: dict[str, object] = field(default_factory=dict)

    def plugin(self, name: str) -> object:
        """The plugin instance called `name` (the loader builds a plugin after those it
        names, wherever they are declared)."""
        try:
            return self._plugins[name]
        except KeyError:
            raise PluginLookupError(f"plugin {name!r} is not declared", name) from None

    def plugins(self) -> Mapping[str, object]:
        return dict(self._plugins)

    def add(self, name: str, plugin: object) -> None:
        self._plugins[name] = plugin
