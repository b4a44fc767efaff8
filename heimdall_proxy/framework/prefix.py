"""Prefix-cache match information shared through the CycleState.

A prefix producer (approx-prefix-cache-producer, precise-prefix-cache-producer, or the seeds'
precise-prefix-cache-scorer) computes, before the profiles run, how much of the request's
prompt each candidate pod already holds in its KV cache, and leaves the result on the
CycleState under `prefix_match_key(type, name)`. Readers find it by the producer's name with
`prefix_match_reader`, without importing the producer: prefix-cache-scorer, no-hit-lru-scorer
(is the request cold?), the affinity filter, prefill deciders (how many prompt tokens are not
cached on the chosen pod?), the latency plugins and the in-flight ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.types import CycleState


def prefix_match_key(plugin_type: str, plugin_name: str) -> str:
    """The CycleState key under which the prefix-cache plugin `type`/`name` publishes its
    PrefixCacheMatchInfo (the EPP keys it by the plugin's typed name the same way)."""
    return f"{plugin_type}/{plugin_name}"


@dataclass(slots=True)
class PrefixCacheMatchInfo:
    """How much of one request's prompt each candidate pod holds.

    `block_size` is in tokens (estimated tokens when the request was not tokenized);
    `total_blocks` is the number of full blocks of the prompt that were looked up (at most
    the scorer's match limit); `matched_blocks[pod]` is the length of the run of cached blocks
    starting at the first block of the prompt, in blocks (a float: the precise scorer weights
    blocks held only in a slower tier below 1). Pods without an entry hold nothing.
    `block_keys`, when the scorer has them, are the prompt's chained block keys: the key of
    block i names the whole prefix up to it, so it identifies a shared prefix across requests
    (the affinity filter counts how popular each one is)."""

    block_size: int
    total_blocks: int
    prompt_tokens: int
    matched_blocks: dict[str, float] = field(default_factory=dict)
    block_keys: Sequence[int] = ()

    def has_hit(self) -> bool:
        """True when at least one pod holds at least the first block."""
        return any(v > 0.0 for v in self.matched_blocks.values())

    def ratio(self, pod: str) -> float:
        """Matched blocks / total blocks, in [0, 1] (0 for a prompt shorter than a block)."""
        if self.total_blocks <= 0:
            return 0.0
        ratio = self.matched_blocks.get(pod, 0.0) / self.total_blocks
        # min(1.0, ratio) without a builtin call (per pod per request; same result for NaN)
        return ratio if ratio < 1.0 else 1.0

    def cached_tokens(self, pod: str) -> int:
        """Prompt tokens `pod` can skip computing: whole matched blocks times the block size,
        never more than the prompt."""
        cached = int(self.matched_blocks.get(pod, 0.0)) * self.block_size
        return cached if cached < self.prompt_tokens else self.prompt_tokens

    def uncached_tokens(self, pod: str) -> int:
        """Prompt tokens `pod` would have to compute."""
        return self.prompt_tokens - self.cached_tokens(pod)


#: The plugin types that publish a prefix match, in the order a name is looked up: llm-d's
#: producers, then the seeds' precise-prefix-cache-scorer, which still owns its index.
#: (prefix-cache-scorer publishes nothing: it reads an approx-prefix-cache-producer.)
PREFIX_PRODUCER_TYPES = (
    "approx-prefix-cache-producer",
    "precise-prefix-cache-producer",
    "burst-prefix-cache-producer",
    "precise-prefix-cache-scorer",
)
#: The seeds' type of the plugin readers named by default, now a reader itself.
LEGACY_SCORER_TYPE = "prefix-cache-scorer"
#: The producer a reader that names none reads (llm-d's default producer name).
DEFAULT_PREFIX_PRODUCER = "approx-prefix-cache-producer"

#: Finds one request's match on its CycleState (None: the producer did not run or matched
#: nothing it could publish).
MatchReader = Callable[[CycleState], "PrefixCacheMatchInfo | None"]


def prefix_match_reader(
    producer_name: str = "", plugin_type: str = "", plugin_name: str = ""
) -> MatchReader:
    """How a reader finds the match of the producer it names, made once per reader (the
    keys are the same for every request).

    `producer_name` (llm-d's `prefixMatchInfoProducerName`) names a prefix producer of any
    kind: an approx-prefix-cache-producer, a precise-prefix-cache-producer, or the seeds'
    precise-prefix-cache-scorer. Without it, the seeds' `prefixPluginType` /
    `prefixPluginName` pair names one (the config loader points a pair that names a
    prefix-cache-scorer at the producer that scorer reads, config/defaults.py); with
    neither, the default-named approx-prefix-cache-producer is read."""
    if producer_name:
        name, first = producer_name, ""
    elif plugin_name:
        name, first = plugin_name, plugin_type
    else:
        name, first = DEFAULT_PREFIX_PRODUCER, ""
    legacy = first == LEGACY_SCORER_TYPE
    if legacy:
        # a prefix-cache-scorer publishes nothing: the pair names a scorer, whose producer the
        # loader names instead. Built without the loader, the seeds' default pair reads the
        # default producer (llm-d ignores the pair and reads its default producer).
        first = ""
    default = prefix_match_key(DEFAULT_PREFIX_PRODUCER, DEFAULT_PREFIX_PRODUCER)
    fallback = (default,) if legacy and name == LEGACY_SCORER_TYPE else ()
    types = ((first,) if first else ()) + tuple(t for t in PREFIX_PRODUCER_TYPES if t != first)
    keys = tuple(prefix_match_key(t, name) for t in types)
    keys += tuple(k for k in fallback if k not in keys)

    def read(state: CycleState) -> PrefixCacheMatchInfo | None:
        for key in keys:
            info = state.get(key)
            if isinstance(info, PrefixCacheMatchInfo):
                return info
        return None

    return read


class PrefixMatchParams(PluginParams):
    """The parameters of a plugin that reads a prefix match: which producer's
    (prefix_match_reader)."""

    #: The seeds' pair: the prefix-cache plugin whose match is read (a pair that names a
    #: prefix-cache-scorer reads the producer that scorer reads).
    prefix_plugin_type: str = "prefix-cache-scorer"
    prefix_plugin_name: str = "prefix-cache-scorer"
    #: llm-d's: the prefix producer whose match is read; when set, prefixPluginType /
    #: prefixPluginName (the seeds') are not used.
    prefix_match_info_producer_name: str = ""

    def match_reader(self) -> MatchReader:
        """The reader of the match these parameters name."""
        return prefix_match_reader(
            self.prefix_match_info_producer_name, self.prefix_plugin_type, self.prefix_plugin_name
        )
