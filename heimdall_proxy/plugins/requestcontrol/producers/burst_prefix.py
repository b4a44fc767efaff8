"""burst-prefix-cache-producer (llm-d's): requests that share a prompt and arrive together
(the samples of one RL rollout group) are placed together, so the shared prefix is prefilled
once instead of on every replica of a cold cache."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, model_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.kvcache.approx import ApproxPrefixIndex
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import (
    CHARS_PER_TOKEN,
    prompt_block_keys,
)

log = logging.getLogger(__name__)

BURST_PREFIX_PRODUCER_TYPE = "burst-prefix-cache-producer"
UNLIMITED = -1
#: The most leading blocks that form a group's key when maxPrefixTokensToMatch is 0.
DEFAULT_MAX_BLOCKS = 2048
MAX_WINDOW_MS = 10000
#: A window's index never evicts (it lives for one window).
_NO_EVICTION = 1 << 62


class BurstPrefixParams(PluginParams):
    """llm-d's parameters and defaults (its README)."""

    window_duration_ms: int = Field(default=100, ge=1, le=MAX_WINDOW_MS)
    #: Samples of one group per replica; -1: the whole group on one replica.
    max_per_replica: int = UNLIMITED
    block_size_tokens: int = Field(default=64, gt=0)
    #: 0: DEFAULT_MAX_BLOCKS blocks.
    max_prefix_tokens_to_match: int = Field(default=0, ge=0)
    #: Shared leading blocks that co-locate distinct groups (and give a lone request an
    #: affinity at all); 0: only identical groups are placed.
    min_colocate_blocks: int = Field(default=0, ge=0)
    #: Requests one window may hold; -1 unlimited.
    max_batch_size: int = 1000
    balance_by: Literal["requests", "tokens"] = "requests"

    @model_validator(mode="after")
    def _check(self) -> BurstPrefixParams:
        if self.max_per_replica != UNLIMITED and self.max_per_replica < 1:
            raise ValueError("maxPerReplica must be -1 (unlimited) or >= 1")
        if self.max_batch_size != UNLIMITED and self.max_batch_size < 1:
            raise ValueError("maxBatchSize must be -1 (unlimited) or >= 1")
        if 0 < self.max_prefix_tokens_to_match < self.block_size_tokens:
            raise ValueError(
                f"maxPrefixTokensToMatch ({self.max_prefix_tokens_to_match}) must be 0 or >= "
                f"blockSizeTokens ({self.block_size_tokens}); a smaller value matches no block"
            )
        return self

    def max_blocks(self) -> int:
        if self.max_prefix_tokens_to_match:
            return self.max_prefix_tokens_to_match // self.block_size_tokens
        return DEFAULT_MAX_BLOCKS


@dataclass(slots=True, eq=False)
class _Entry:
    keys: list[int]
    endpoints: list[Endpoint]
    #: The replica the batch placed it on; None: no affinity (other scorers decide).
    assigned: str | None = None


@dataclass(slots=True)
class _Batch:
    entries: list[_Entry] = field(default_factory=list)
    sealed: asyncio.Event = field(default_factory=asyncio.Event)


@register(BURST_PREFIX_PRODUCER_TYPE, BurstPrefixParams)
class BurstPrefixCacheProducer(BasePlugin[BurstPrefixParams]):
    """Holds each request up to `windowDurationMs` while a window fills, then places the
    window's requests jointly and publishes, per request, a PrefixCacheMatchInfo with the
    whole prompt matched on the replica it was placed on and nothing elsewhere, under its
    name for prefix-cache-scorer (`prefixMatchInfoProducerName: burst-prefix-cache-producer`).

    Placement: prompts are cut into chained block keys as approx-prefix-cache-producer cuts
    them (its `prompt_block_keys`: token ids from a token-producer, else characters), at
    most `maxPrefixTokensToMatch / blockSizeTokens` blocks (2048 when 0). Requests with the
    same keys form a group; a group of two or more is always placed, a lone request only
    when `minColocateBlocks` > 0 and it shares that many leading blocks with another request
    of the window. Groups go first, then the lone requests, longest prompt first. A group
    fills one replica up to `maxPerReplica` samples, then spills to the least loaded. Its
    first replica is the one already holding the longest shared prefix (at least
    `minColocateBlocks` blocks) of the units placed before it, unless that replica has its
    fair share of the window (the window's load over the replicas, rounded up); otherwise
    the least loaded (then fewest running, then name). Load counts requests, or with
    `balanceBy: tokens` the blocks a replica must still prefill for a unit (the leading
    blocks it already holds in this window are free). The placed prefixes are recorded in
    a window-local approximate prefix index (kvcache/approx.py), which answers the longest
    shared prefix per replica.

    A request whose prompt is shorter than a block, or shares nothing, gets no affinity; so
    does one whose replica left the candidates meanwhile. A window holding `maxBatchSize`
    requests refuses more: the request is produced for without affinity (logged), where
    llm-d's producer errs and its director goes on without the data all the same. Cross-window
    reuse is left to approx- or precise-prefix-cache-producer beside it."""

    type = BURST_PREFIX_PRODUCER_TYPE

    def __init__(self, name: str, params: BurstPrefixParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.state_key = prefix_match_key(self.type, name)
        self.window = params.window_duration_ms / 1000.0
        self._batch: _Batch | None = None

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        p = self.params
        keys = prompt_block_keys(request, p.block_size_tokens, p.max_blocks())
        entry = _Entry(keys, endpoints)
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            asyncio.get_running_loop().call_later(self.window, self._seal, batch)
        if p.max_batch_size != UNLIMITED and len(batch.entries) >= p.max_batch_size:
            log.warning(
                "%s: window full (maxBatchSize %d): request %s gets no affinity",
                self.name,
                p.max_batch_size,
                request.request_id,
            )
        else:
            batch.entries.append(entry)
            await batch.sealed.wait()
        total = len(keys)
        names = {e.name for e in endpoints}
        matched: dict[str, float] = {}
        if entry.assigned is not None and entry.assigned in names:
            matched[entry.assigned] = float(total)
        state[self.state_key] = PrefixCacheMatchInfo(
            p.block_size_tokens,
            total,
            request.estimated_tokens(CHARS_PER_TOKEN),
            matched,
            keys,
        )

    def _seal(self, batch: _Batch) -> None:
        if self._batch is batch:
            self._batch = None
        try:
            place(batch.entries, self.params)
        finally:
            batch.sealed.set()


def place(entries: list[_Entry], p: BurstPrefixParams) -> None:
    """Assign each entry of a window its replica (see BurstPrefixCacheProducer)."""
    groups: dict[tuple[int, int], list[_Entry]] = {}
    replicas: list[Endpoint] = []
    for e in entries:
        if not e.keys:
            continue
        groups.setdefault((len(e.keys), e.keys[-1]), []).append(e)
        if not replicas:
            replicas = e.endpoints
    if not replicas:
        return
    shared = _shared_keys(groups, p.min_colocate_blocks)
    units = [k for k, g in groups.items() if len(g) >= 2]
    singles = [k for k, g in groups.items() if len(g) == 1 and k in shared]
    units.sort(key=lambda k: -k[0])  # stable: longest prompt first, arrival order within
    singles.sort(key=lambda k: -k[0])
    by_tokens = p.balance_by == "tokens"
    total = sum(k[0] if by_tokens else len(groups[k]) for k in (*units, *singles))
    fair = -(-total // len(replicas))
    index = ApproxPrefixIndex(_NO_EVICTION)
    load: dict[str, int] = {}
    for key in (*units, *singles):
        _place_unit(groups[key], replicas, p, fair, index, load, by_tokens)


def _shared_keys(groups: dict[tuple[int, int], list[_Entry]], n: int) -> set[tuple[int, int]]:
    """The groups whose first `n` blocks some other request of the window shares (the key of
    block n - 1 names the whole n-block prefix: the keys are chained)."""
    if n <= 0:
        return set()
    count: dict[int, int] = {}
    for (blocks, _), members in groups.items():
        if blocks >= n:
            sig = members[0].keys[n - 1]
            count[sig] = count.get(sig, 0) + len(members)
    return {
        key for key, members in groups.items() if key[0] >= n and count[members[0].keys[n - 1]] >= 2
    }


def _place_unit(
    members: list[_Entry],
    replicas: list[Endpoint],
    p: BurstPrefixParams,
    fair: int,
    index: ApproxPrefixIndex,
    load: dict[str, int],
    by_tokens: bool,
) -> None:
    keys = members[0].keys
    k = p.max_per_replica
    prefer = p.min_colocate_blocks > 0
    held = index.match(keys, [r.name for r in replicas]) if prefer or by_tokens else {}
    here: dict[str, int] = {}  # members of this unit per replica
    i = 0
    while i < len(members):
        target = _pick(replicas, here, k, load, held, p.min_colocate_blocks, fair, prefer)
        room = len(members) - i
        if k != UNLIMITED:
            room = min(room, max(1, k - here.get(target, 0)))
        for m in members[i : i + room]:
            m.assigned = target
        first = target not in here
        here[target] = here.get(target, 0) + room
        if not by_tokens:
            load[target] = load.get(target, 0) + room
        elif first:  # the prefix is prefilled once per replica, less what it holds
            load[target] = load.get(target, 0) + max(0, len(keys) - held.get(target, 0))
        i += room
        prefer = False  # only the unit's first replica follows the shared prefix
    for target in here:
        index.add(target, keys)


def _pick(
    replicas: list[Endpoint],
    here: dict[str, int],
    k: int,
    load: dict[str, int],
    held: dict[str, int],
    min_blocks: int,
    fair: int,
    prefer: bool,
) -> str:
    def rank(r: Endpoint) -> tuple[int, int, str]:
        return (load.get(r.name, 0), r.metrics.running, r.name)

    def has_room(r: Endpoint) -> bool:
        return k == UNLIMITED or here.get(r.name, 0) < k

    if prefer:
        sharing = [
            r
            for r in replicas
            if has_room(r) and load.get(r.name, 0) < fair and held.get(r.name, 0) >= min_blocks
        ]
        if sharing:
            return min(sharing, key=lambda r: (-held.get(r.name, 0), *rank(r))).name
    open_ = [r for r in replicas if has_room(r)] or replicas
    return min(open_, key=rank).name
