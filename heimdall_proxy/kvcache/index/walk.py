"""The lookup walk shared by the backends: per pod, the tier-weighted run of blocks it holds
from the start of the prompt, computed on integer presence masks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate, groupby
from operator import and_, or_
from typing import TypeVar

from heimdall_proxy.kvcache.index.stats import KVCacheStats

#: What a caller names its sources by (a pod's name; the conductor's (backend, rank)).
Name = TypeVar("Name")


def iter_bits(mask: int) -> list[int]:
    """The single-bit values set in `mask`."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low)
        mask ^= low
    return out


class RunWalker:
    """Longest runs of blocks from the start of a prompt, per pod, fed the prompt's presence
    masks a chunk at a time (bit b: the pod with bit b holds the block).

    `fast[j]` has the pods holding block j in the fastest tier (or speculatively); each entry
    of `lows` is (masks, loss) for a slower tier, fastest first, where `loss` is the weight a
    block held only there loses. The walk over a chunk is C-level (itertools.accumulate of
    the AND of masks); Python code runs only where a pod drops out or a block is held in a
    slower tier only."""

    __slots__ = ("alive", "blocks", "deficit", "done", "dropped_at", "runs", "top")

    def __init__(self, candidates: int, top_weight: float = 1.0) -> None:
        self.alive = candidates
        self.top = top_weight
        self.blocks = 0
        self.deficit: dict[int, float] = {}
        self.runs: dict[int, float] = {}
        self.dropped_at = 0
        self.done = not candidates

    def feed(self, fast: list[int], lows: Sequence[tuple[list[int], float]] = ()) -> bool:
        """Walk one chunk; False once no candidate is left (the rest of the prompt is moot)."""
        if self.done:
            return False
        present = fast
        for masks, _ in lows:
            present = list(map(or_, present, masks))
        acc = list(accumulate(present, and_, initial=self.alive))
        if lows:
            covered = fast
            deficit = self.deficit
            for masks, loss in lows:
                for j, m in enumerate(masks):
                    m &= acc[j + 1] & ~covered[j]
                    if m:
                        for b in iter_bits(m):
                            deficit[b] = deficit.get(b, 0.0) + loss
                covered = list(map(or_, covered, masks))
        final = acc[-1]
        if final != self.alive:
            # acc only ever loses bits: visit the points where it changes (groupby runs in C)
            prev = self.alive
            base = self.blocks - 1
            runs, top, deficit = self.runs, self.top, self.deficit
            held = self.dropped_at
            for a, group in groupby(range(1, len(acc)), acc.__getitem__):
                if a == prev:
                    continue
                held = base + next(group)
                if held:
                    gone = prev & ~a
                    if not gone & (gone - 1):  # one pod dropped here (the usual case)
                        runs[gone] = held * top - deficit.get(gone, 0.0)
                    else:
                        for b in iter_bits(gone):
                            runs[b] = held * top - deficit.get(b, 0.0)
                prev = a
                if not a:
                    break
            self.dropped_at = held
            self.alive = final
        self.blocks += len(fast)
        if not final:
            self.done = True
        return not self.done

    @property
    def longest(self) -> int:
        """Blocks from the start held by some candidate (the longest run, unweighted)."""
        return self.blocks if self.alive else self.dropped_at

    def result(self, names: Mapping[int, Name]) -> dict[Name, float]:
        """pod name (`names[bit]`) -> weighted run, for pods that hold at least the first
        block."""
        runs = dict(self.runs)
        if self.alive and self.blocks:
            for b in iter_bits(self.alive):
                runs[b] = self.blocks * self.top - self.deficit.get(b, 0.0)
        return {names[b]: v for b, v in runs.items() if v > 0.0}


def finish_lookup(
    stats: KVCacheStats, walker: RunWalker, n_keys: int, names: Mapping[int, str]
) -> dict[str, float]:
    """A finished walk's result, counted in `stats` (the lookup itself already was)."""
    out = walker.result(names)
    stats.lookup_keys += n_keys
    stats.lookup_key_hits += walker.longest
    if out:
        stats.lookup_hits += 1
    return out


#: Blocks looked up per step of a walk (a cold prompt stops after the first step).
WALK_CHUNK = 64
