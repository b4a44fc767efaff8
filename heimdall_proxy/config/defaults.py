"""Every default Heimdall applies to an EndpointPickerConfig, in one place.

- A config that declares no plugins gets the EPP's default shape (`DEFAULT_EPP`).
- A config without scheduling profiles gets one profile, "default", holding every declared
  filter, scorer and picker in declaration order.
- Every prefix reader reads an approx-prefix-cache-producer unless it names another
  producer: a prefix-cache-scorer with the seeds' index parameters gets one made with them;
  one that names none reads the config's, else a default one; readers naming a
  prefix-cache-scorer read its producer (`add_prefix_producers`).
- A profile without a picker gets a max-score-picker (maxNumOfEndpoints 1).
- A config without a profile handler gets a single-profile-handler.
- Flow control without a saturation detector uses a utilization-detector (the one declared
  under that name, else one with its defaults); a priority band without policies uses
  global-strict fairness and FCFS ordering (llm-d's defaults).

The loader applies the first three to the config before instantiating anything, the last two
when it assembles the profiles; no other module supplies a default."""

from __future__ import annotations

import copy
import logging
from typing import Any

from heimdall_proxy.config.gateway import (
    EndpointPickerConfig,
    PluginConfig,
    ProfilePluginRef,
    SchedulingProfileConfig,
)

log = logging.getLogger(__name__)

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
#: llm-d's usage limit when flowControl names none: a plugin of this name if declared,
#: else no gating below saturation 1.0 (what its static policy at threshold 1.0 does).
DEFAULT_USAGE_LIMIT = "static-usage-limit-policy"

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
#: Declared plugin types that publish a prefix match a reader can name.
PREFIX_PUBLISHERS = frozenset(
    {
        APPROX_PRODUCER,
        "precise-prefix-cache-producer",
        "precise-prefix-cache-scorer",
        "burst-prefix-cache-producer",
    }
)
#: approx-prefix-cache-producer's parameters, which the seeds put on prefix-cache-scorer (the
#: index's, then those of its replica sharing, an extension).
INDEX_PARAMETERS = frozenset(
    {"autoTune", "blockSizeTokens", "blockSize", "maxPrefixBlocksToMatch",
     "maxPrefixTokensToMatch", "lruCapacityPerServer",
     "redisConfig", "valkeyConfig", "syncInterval", "historyEntries"}
)  # fmt: skip
#: The seeds' defaults for the index of prefix-cache-scorer, where they differ from llm-d's
#: for approx-prefix-cache-producer: a producer made for a seeds' scorer keeps them, so the
#: config routes as it did.
SEED_INDEX_DEFAULTS: dict[str, Any] = {"maxPrefixBlocksToMatch": 256, "maxPrefixTokensToMatch": 0}
#: Plugins that read a prefix match by `prefixPluginType` / `prefixPluginName` (defaults: a
#: prefix-cache-scorer named prefix-cache-scorer; pd-profile-handler's name defaults to the
#: type) unless they name a producer with `prefixMatchInfoProducerName`.
PREFIX_READERS = frozenset(
    {"no-hit-lru-scorer", "prefix-cache-affinity-filter", "outstanding-work-scorer",
     "finish-time-scorer", "latency-scorer", "predicted-latency-producer", "pd-profile-handler"}
)  # fmt: skip
#: Plugins that need a prefix match to work at all: a config that declares one and no prefix
#: producer gets the default approx-prefix-cache-producer (llm-d injects a default producer
#: for the data a plugin requires).
PREFIX_CONSUMERS = frozenset(
    {PREFIX_SCORER, "no-hit-lru-scorer", "prefix-cache-affinity-filter", "prefix-based-pd-decider"}
)


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 1
    while out in taken:
        n += 1
        out = f"{name}-{n}"
    taken.add(out)
    return out


PD_PROFILE_HANDLER = "pd-profile-handler"
PREFIX_BASED_PD_DECIDER = "prefix-based-pd-decider"


def add_default_deciders(epp: EndpointPickerConfig) -> EndpointPickerConfig:
    """A pd-profile-handler whose decider (`deciderPluginName`, by default
    prefix-based-pd-decider) is not declared gets that decider with its defaults, as the
    seeds' PD example expects (it declares none). With the default `nonCachedTokens` of 0
    prefill never runs, so the example serves decode-only until a threshold is set."""
    plugins = list(epp.plugins)
    names = {p.instance_name for p in plugins}
    added = []
    for p in plugins:
        if p.type != PD_PROFILE_HANDLER:
            continue
        wanted = (p.parameters or {}).get("deciderPluginName", PREFIX_BASED_PD_DECIDER)
        if wanted == PREFIX_BASED_PD_DECIDER and wanted not in names:
            log.info(
                "%s %r: decider %r is not declared; using one with its defaults "
                "(nonCachedTokens 0: prefill never runs)",
                PD_PROFILE_HANDLER,
                p.instance_name,
                wanted,
            )
            added.append(PluginConfig(type=PREFIX_BASED_PD_DECIDER))
            names.add(wanted)
    if not added:
        return epp
    return epp.model_copy(update={"plugins": [*added, *plugins]})


def add_prefix_producers(epp: EndpointPickerConfig) -> EndpointPickerConfig:
    """Give every prefix reader the approx-prefix-cache-producer it reads (llm-d's defaulting,
    and the seeds' shape), or `epp` as it is when nothing changes:

    - a prefix-cache-scorer with index parameters (the seeds' shape) gets a producer of its
      own with those parameters (and the seeds' defaults for the others), named
      approx-prefix-cache-producer when it is the default-named scorer and that name is free,
      else `approx-prefix-cache-producer-<scorer>`; the scorer reads it;
    - a prefix-cache-scorer that names no producer reads the config's first
      approx-prefix-cache-producer, else a default one (with the seeds' defaults: the seeds
      declared such a scorer alone) that all of them share;
    - the readers whose `prefixPluginType` / `prefixPluginName` name a prefix-cache-scorer,
      by default or explicitly, read that scorer's producer; those left with the default
      names and nothing to read read the config's first approx producer, else the default
      one (llm-d's defaults), which is added when a plugin needs a match (PREFIX_CONSUMERS)
      and the config declares no prefix producer of any kind.

    A made producer is placed just before the first plugin that reads it, so the producers
    that run before that plugin (a token-producer) run before it too."""
    plugins = list(epp.plugins)
    taken = {p.instance_name for p in plugins}
    declared = [p.instance_name for p in plugins if p.type == APPROX_PRODUCER]
    has_publisher = any(p.type in PREFIX_PUBLISHERS for p in plugins)
    made: dict[str, PluginConfig] = {}  # producer name -> made producer
    before: dict[str, str] = {}  # producer name -> the plugin it goes before
    #: the producer each prefix-cache-scorer reads
    read_by: dict[str, str] = {}
    shared = ""  # the producer the scorers without parameters share

    def make(name: str, params: dict[str, Any], reader: str) -> str:
        made[name] = PluginConfig(type=APPROX_PRODUCER, name=name, parameters=params)
        before[name] = reader
        return name

    out: list[PluginConfig] = []
    for p in plugins:
        params = dict(p.parameters or {})
        if p.type == PREFIX_SCORER and not params.get("prefixMatchInfoProducerName"):
            index = {k: params.pop(k) for k in list(params) if k in INDEX_PARAMETERS}
            if index:
                wanted = (
                    APPROX_PRODUCER
                    if p.instance_name == PREFIX_SCORER
                    else f"{APPROX_PRODUCER}-{p.instance_name}"
                )
                producer = make(
                    _unique(wanted, taken), {**SEED_INDEX_DEFAULTS, **index}, p.instance_name
                )
            elif declared:
                producer = declared[0]
            else:
                if not shared:
                    shared = make(
                        _unique(APPROX_PRODUCER, taken), dict(SEED_INDEX_DEFAULTS), p.instance_name
                    )
                producer = shared
            params["prefixMatchInfoProducerName"] = producer
            read_by[p.instance_name] = producer
            p = p.model_copy(update={"parameters": params})
        out.append(p)

    default = declared[0] if declared else read_by.get(PREFIX_SCORER, shared)
    needs_default = not default and not has_publisher and not made
    if needs_default and any(p.type in PREFIX_CONSUMERS for p in out):
        first = next(p.instance_name for p in out if p.type in PREFIX_CONSUMERS)
        default = make(_unique(APPROX_PRODUCER, taken), {}, first)

    linked: list[PluginConfig] = []
    for p in out:
        params = dict(p.parameters or {})
        if p.type == "inflight-load-producer":
            if default and not params.get("prefixMatchInfoProducerName"):
                params["prefixMatchInfoProducerName"] = default
        elif p.type in PREFIX_READERS and not params.get("prefixMatchInfoProducerName"):
            kind = params.get("prefixPluginType", PREFIX_SCORER)
            named = "prefixPluginName" in params or "prefixPluginType" in params
            name = params.get("prefixPluginName") or (
                kind if p.type == "pd-profile-handler" else PREFIX_SCORER
            )
            producer = read_by.get(name, "") if kind == PREFIX_SCORER else ""
            if not producer and not named and not (has_publisher and not default):
                producer = default
            if producer:
                params["prefixPluginType"] = APPROX_PRODUCER
                params["prefixPluginName"] = producer
        for name, reader in before.items():
            if reader == p.instance_name:
                linked.append(made[name])
        linked.append(
            p if params == (p.parameters or {}) else p.model_copy(update={"parameters": params})
        )
    if linked == list(epp.plugins):
        return epp
    return epp.model_copy(update={"plugins": linked})


def default_profiles(in_profiles: list[str]) -> list[SchedulingProfileConfig]:
    """The one profile Heimdall builds when none is declared, from the names of the declared
    plugins that can sit in a profile (filters, scorers, pickers)."""
    refs = [ProfilePluginRef(plugin_ref=name) for name in in_profiles]
    return [SchedulingProfileConfig(name=DEFAULT_PROFILE, plugins=refs)]


#: llm-d's parsers when a config lists none (`requestHandler.parsers`): the three APIs, then
#: passthrough-parser as the fallback for any other path the gateway forwards. A declared
#: plugin of one of these types serves as it; the others are made for the table alone.
DEFAULT_PARSERS = ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser")
