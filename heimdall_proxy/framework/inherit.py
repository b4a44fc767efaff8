"""What a config reload keeps: each plugin of the new config that implements `Inherits` takes
over the state of the plugin of the same name and type in the config it replaces.

Without it, a reload (which is also how pods are added to or removed from a static list)
would empty the prefix index and the no-hit LRU (routing loses its cache affinity until
traffic rebuilds it), zero the in-flight ledgers while the old requests still run (every pod
looks idle for a moment), forget a trained latency model and lose the Responses-API entries
of an in-memory store (a `previous_response_id` answered 404)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.plugins import Inherits

log = logging.getLogger(__name__)


def inherit_state(
    previous: Mapping[str, object], plugins: Mapping[str, object], gone: frozenset[str]
) -> list[str]:
    """Hand every plugin in `plugins` its predecessor's state, less what it kept for the pods
    in `gone`; the names of those that took all of it over. What a plugin did not take is
    logged with its reason, a plugin that raises with the error: the reload goes on (it is
    past the point where it could be refused)."""
    kept: list[str] = []
    for name, plugin in plugins.items():
        old = previous.get(name)
        if old is None or type(old) is not type(plugin) or not isinstance(plugin, Inherits):
            continue
        try:
            reason = plugin.inherit(old, gone)
        except Exception:
            log.exception("plugin %r could not take over its predecessor's state", name)
            continue
        if reason is None:
            kept.append(name)
        else:
            log.info("plugin %r after the reload: %s", name, reason)
    return kept


def changed(previous: PluginParams, current: PluginParams, *fields: str) -> str | None:
    """None when the named parameters are equal, else which changed (by their YAML names): the
    usual reason for declining a state whose meaning they define."""
    names = type(current).model_fields
    diff = [names[f].alias or f for f in fields if getattr(previous, f) != getattr(current, f)]
    return f"{', '.join(diff)} changed" if diff else None
