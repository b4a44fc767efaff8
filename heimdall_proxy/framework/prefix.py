"""Prefix-cache match information shared through the CycleState.

A prefix-cache scorer (prefix-cache-scorer, precise-prefix-cache-scorer) computes, before the
profiles run, how much of the request's prompt each candidate pod already holds in its KV
cache, and leaves the result on the CycleState under `prefix_match_key(type, name)`. Other
plugins read it from there without importing the scorer: no-hit-lru-scorer (is the request
cold?) and prefill deciders (how many prompt tokens are not cached on the chosen pod?).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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


def read_prefix_match(
    state: CycleState, plugin_type: str, plugin_name: str
) -> PrefixCacheMatchInfo | None:
    """The match information `type`/`name` left on `state`, or None when it has not run (or
    left something else under that key)."""
    info = state.get(prefix_match_key(plugin_type, plugin_name))
    return info if isinstance(info, PrefixCacheMatchInfo) else None


def match_at(state: CycleState, key: str) -> PrefixCacheMatchInfo | None:
    """`read_prefix_match` by a key its caller made once with `prefix_match_key` (plugins
    read the match several times per request; the key is the same every time)."""
    info = state.get(key)
    return info if isinstance(info, PrefixCacheMatchInfo) else None


#: The plugin types that publish a prefix match, in the order a name is looked up: llm-d's
#: producers, then the seeds' scorers that own an index.
PREFIX_PRODUCER_TYPES = (
    "approx-prefix-cache-producer",
    "precise-prefix-cache-producer",
    "prefix-cache-scorer",
    "precise-prefix-cache-scorer",
)


def producer_match_keys(producer_name: str) -> tuple[str, ...]:
    """The keys under which a prefix plugin named `producer_name` may have published its
    match, whatever its type (a reader that names a producer need not say which kind)."""
    return tuple(prefix_match_key(t, producer_name) for t in PREFIX_PRODUCER_TYPES)


def find_match(state: CycleState, keys: Sequence[str]) -> PrefixCacheMatchInfo | None:
    """The first match published under `keys` (from `producer_match_keys`)."""
    for key in keys:
        info = state.get(key)
        if isinstance(info, PrefixCacheMatchInfo):
            return info
    return None
