"""Every default Heimdall applies to an EndpointPickerConfig, in one place.

- A config that declares no plugins gets the EPP's default shape (`DEFAULT_EPP`).
- A config without scheduling profiles gets one profile, "default", holding every declared
  filter, scorer and picker in declaration order.
- A prefix-cache-scorer that names no producer reads the config's (first)
  approx-prefix-cache-producer when it declares one and the scorer carries no index
  parameters of its own (`link_prefix_producers`); the other prefix readers that name no
  prefix plugin, and whose default (a prefix-cache-scorer keeping its own index) is not
  declared, read that producer too. Without a producer, a prefix-cache-scorer keeps its own
  index, as in the seeds.
- A profile without a picker gets a max-score-picker (maxNumOfEndpoints 1).
- A config without a profile handler gets a single-profile-handler.
- Flow control without a saturation detector uses a utilization-detector (the one declared
  under that name, else one with its defaults); a priority band without policies uses
  global-strict fairness and FCFS ordering (llm-d's defaults).

The loader applies the first three to the config before instantiating anything, the last two
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


APPROX_PRODUCER = "approx-prefix-cache-producer"
PREFIX_SCORER = "prefix-cache-scorer"
#: prefix-cache-scorer's parameters that configure an index of its own (the seeds' shape).
INDEX_PARAMETERS = frozenset(
    {"autoTune", "blockSizeTokens", "blockSize", "maxPrefixBlocksToMatch",
     "maxPrefixTokensToMatch", "lruCapacityPerServer", "redisConfig", "valkeyConfig"}
)  # fmt: skip
#: Plugins that read a prefix match by `prefixPluginType` / `prefixPluginName` (default: the
#: prefix-cache-scorer named prefix-cache-scorer).
PREFIX_READERS = frozenset(
    {"no-hit-lru-scorer", "prefix-cache-affinity-filter", "outstanding-work-scorer",
     "latency-scorer", "predicted-latency-producer", "pd-profile-handler"}
)  # fmt: skip


def link_prefix_producers(epp: EndpointPickerConfig) -> EndpointPickerConfig:
    """Point the prefix readers that name no producer at the config's
    approx-prefix-cache-producer (llm-d's defaulting), or `epp` as it is when it has none."""
    producers = [p for p in epp.plugins if p.type == APPROX_PRODUCER]
    if not producers:
        return epp
    producer = producers[0].name or APPROX_PRODUCER
    owners = {
        p.name or p.type
        for p in epp.plugins
        if p.type == PREFIX_SCORER
        and (
            INDEX_PARAMETERS & set(p.parameters or {})
            and not (p.parameters or {}).get("prefixMatchInfoProducerName")
        )
    }
    plugins = []
    for p in epp.plugins:
        params = dict(p.parameters or {})
        if p.type == PREFIX_SCORER and not params.get("prefixMatchInfoProducerName"):
            if not INDEX_PARAMETERS & set(params):
                params["prefixMatchInfoProducerName"] = producer
        elif p.type == "inflight-load-producer" and PREFIX_SCORER not in owners:
            params.setdefault("prefixMatchInfoProducerName", producer)
        elif (
            p.type in PREFIX_READERS
            and "prefixPluginType" not in params
            and "prefixPluginName" not in params
            and PREFIX_SCORER not in owners
        ):
            params["prefixPluginType"] = APPROX_PRODUCER
            params["prefixPluginName"] = producer
        plugins.append(
            p if params == (p.parameters or {}) else p.model_copy(update={"parameters": params})
        )
    return epp.model_copy(update={"plugins": plugins})


def default_profiles(in_profiles: list[str]) -> list[SchedulingProfileConfig]:
    """The one profile Heimdall builds when none is declared, from the names of the declared
    plugins that can sit in a profile (filters, scorers, pickers)."""
    refs = [ProfilePluginRef(plugin_ref=name) for name in in_profiles]
    return [SchedulingProfileConfig(name=DEFAULT_PROFILE, plugins=refs)]
