"""The approximate prefix index: which block keys each pod was recently sent.

Nothing here is observed on the pods: a pod is assumed to hold the blocks of the prompts this
gateway routed to it, up to a per-pod capacity, least recently routed evicted first. That is
what the EPP's approximate prefix-cache scorer assumes too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class ApproxPrefixIndex:
    """Block key -> pods holding it, plus one LRU of keys per pod bounding what it holds.

    Single-threaded (the event loop): no locking."""

    __slots__ = ("_default_capacity", "_holders", "_lrus")

    def __init__(self, default_capacity: int) -> None:
        self._default_capacity = default_capacity
        self._holders: dict[int, set[str]] = {}
        self._lrus: dict[str, OrderedDict[int, None]] = {}

    def add(self, pod: str, keys: Iterable[int], capacity: int | None = None) -> None:
        """Record that `pod` now holds `keys` (most recent last); evict its least recently
        added keys beyond `capacity` (the default capacity when None)."""
        lru = self._lrus.get(pod)
        if lru is None:
            lru = self._lrus[pod] = OrderedDict()
        limit = capacity or self._default_capacity
        holders = self._holders
        for key in keys:
            if key in lru:
                lru.move_to_end(key)
                continue
            lru[key] = None
            pods = holders.get(key)
            if pods is None:
                holders[key] = {pod}
            else:
                pods.add(pod)
        while len(lru) > limit:
            old, _ = lru.popitem(last=False)
            pods = holders.get(old)
            if pods is not None:
                pods.discard(pod)
                if not pods:
                    del holders[old]

    def match(self, keys: Sequence[int], pods: Iterable[str]) -> dict[str, int]:
        """For each of `pods`, the number of leading `keys` it holds (consecutive from the
        first); pods holding none are left out. `pods` may be a (frozen)set, which is not
        copied: the first block narrows it to its few holders from their side."""
        out: dict[str, int] = {}
        holders = self._holders
        first = holders.get(keys[0]) if keys else None
        if not first:
            return out
        alive = (pods if isinstance(pods, (set, frozenset)) else set(pods)) & first
        if not alive:
            return out
        run = 1
        for i, key in enumerate(keys[1:], 1):  # i >= 1: a pod that drops out held i blocks
            have = holders.get(key)
            if not have:
                break
            gone = alive - have
            if gone:
                for pod in gone:
                    out[pod] = i
                alive -= gone
                if not alive:
                    return out
            run = i + 1
        if run:
            for pod in alive:
                out[pod] = run
        return out

    def forget(self, pod: str) -> None:
        """Drop everything recorded for `pod`."""
        lru = self._lrus.pop(pod, None)
        if lru is None:
            return
        for key in lru:
            pods = self._holders.get(key)
            if pods is not None:
                pods.discard(pod)
                if not pods:
                    del self._holders[key]

    def size(self, pod: str) -> int:
        lru = self._lrus.get(pod)
        return len(lru) if lru else 0

    def __len__(self) -> int:
        return len(self._holders)
