"""Built-in plugins, one module each. `heimdall_proxy.builtins` registers them."""

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
