"""Every default Heimdall applies to an EndpointPickerConfig, in one place.

- A config that declares no plugins gets the EPP's default shape (`DEFAULT_EPP`).
- A config without scheduling profiles gets one profile, "default", holding every declared
  filter, scorer and picker in declaration order.
- A profile without a picker gets a max-score-picker (maxNumOfEndpoints 1).
- A config without a profile handler gets a single-profile-handler.
- Flow control without a saturation detector uses a utilization-detector (the one declared
  under that name, else one with its defaults); a priority band without policies uses
  global-strict fairness and FCFS ordering (llm-d's defaults).

The loader applies the first two to the config before instantiating anything, the last two
when it assembles the profiles; no other module supplies a default."""

from __future__ import annotations

import copy
from typing import Any

from heimdall_proxy.config import (
    EndpointPickerConfig,
    PluginConfig,
    ProfilePluginRef,
    SchedulingProfileConfig,
)

SINGLE_PROFILE_HANDLER = "single-profile-handler"
MAX_SCORE_PICKER = "max-score-picker"
DEFAULT_PROFILE = "default"

#: The EndpointPickerConfig used when a file declares no plugins (the EPP's default shape).
DEFAULT_EPP: dict[str, Any] = {
    "plugins": [
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": DEFAULT_PROFILE,
            "plugins": [
                {"pluginRef": "queue-scorer"},
                {"pluginRef": "kv-cache-utilization-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}

#: Flow control's default detector and band policies (plugin types, and the names looked up
#: in `plugins` before one is built with its defaults).
DEFAULT_DETECTOR = "utilization-detector"
DEFAULT_FAIRNESS = "global-strict-fairness-policy"
DEFAULT_ORDERING = "fcfs-ordering-policy"

DEFAULT_PICKER = PluginConfig(type=MAX_SCORE_PICKER)
DEFAULT_HANDLER = PluginConfig(type=SINGLE_PROFILE_HANDLER)


def with_default_plugins(epp: EndpointPickerConfig) -> EndpointPickerConfig:
    """`epp`, or the default plugins and profile in its place when it declares no plugins."""
    if epp.plugins:
        return epp
    default = EndpointPickerConfig.model_validate(copy.deepcopy(DEFAULT_EPP))
    return epp.model_copy(
        update={"plugins": default.plugins, "scheduling_profiles": default.scheduling_profiles}
    )


def default_profiles(in_profiles: list[str]) -> list[SchedulingProfileConfig]:
    """The one profile Heimdall builds when none is declared, from the names of the declared
    plugins that can sit in a profile (filters, scorers, pickers)."""
    refs = [ProfilePluginRef(plugin_ref=name) for name in in_profiles]
    return [SchedulingProfileConfig(name=DEFAULT_PROFILE, plugins=refs)]
