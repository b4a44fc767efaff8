"""Built-in plugins. Importing this package registers every plugin type."""

from heimdall_proxy.plugins import (
    deciders,
    filters,
    pickers,
    prepare,
    profiles,
    requestcontrol,
    scorers,
    store,
)

__all__ = [
    "deciders",
    "filters",
    "pickers",
    "prepare",
    "profiles",
    "requestcontrol",
    "scorers",
    "store",
]
