"""A convenience base class for plugins: stores the instance name and parameters."""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams

P = TypeVar("P", bound=PluginParams)


class BasePlugin(Generic[P]):
    """Subclasses set `type` to their registered type name and register with
    `@register(TYPE, Params)`; the class itself is the factory."""

    type: ClassVar[str]
    #: Metric families of a pod's /metrics page this plugin reads beyond the core ones
    #: (queue, running, KV usage): the data layer scrapes the union of every configured
    #: plugin's, and parses nothing else.
    metric_families: frozenset[str] = frozenset()  # a plugin may set its own at build

    def __init__(self, name: str, params: P, handle: PluginHandle) -> None:
        self.name = name
        self.params = params

    def __repr__(self) -> str:
        return f"<{self.type} {self.name!r}>"
