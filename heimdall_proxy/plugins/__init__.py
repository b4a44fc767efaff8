"""Built-in plugins. Importing this package registers every plugin type."""

from heimdall_proxy.plugins import filters, pickers, prepare, profiles, requestcontrol, scorers

__all__ = ["filters", "pickers", "prepare", "profiles", "requestcontrol", "scorers"]
