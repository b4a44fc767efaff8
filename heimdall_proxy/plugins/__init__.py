"""Built-in plugins. Importing this package registers every plugin type."""

from heimdall_proxy.plugins import (
    datasources,
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
    "datasources",
    "deciders",
    "filters",
    "pickers",
    "prepare",
    "profiles",
    "requestcontrol",
    "scorers",
    "store",
]
