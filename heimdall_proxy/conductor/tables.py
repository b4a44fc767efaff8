"""The conductor's block maps: the index's (key -> bitmask of sources, per namespace and
medium) and each publisher's engine-hash map (engine hash -> our key).

Both hold one entry per block, millions of them. `U64Map` (native/_u64map.c, built where
the machine can) keeps an entry in ~40 bytes with no Python object, where a dict of ints
costs ~130 bytes and two long-lived ints per block; writing them was most of a vLLM block's
ingest at the issue's scale. `DictMap` is the same map over a dict, for what a U64Map cannot
hold (a bitmask past 64 sources in one namespace; an engine hash that is no u64, or an
engine block spanning several of ours, whose entry is a tuple) and for machines without
the extension. Both answer the same methods with the same results, so the index and the
engine maps call one API (tests/conductor/test_u64map.py runs them side by side).

Order is first-written, as a dict's: eviction deletes the oldest-written keys first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat
from operator import and_
from typing import Any, Protocol

from heimdall_proxy.kvcache.index.keys import evict_oldest

#: Events of at most this many keys are set a key at a time (see DictMap.or_bits).
SMALL_EVENT = 4
#: The widest value a U64Map holds.
U64_LIMIT = 1 << 64


class BlockMap(Protocol):
    """What the index and the engine maps use of a map (U64Map and DictMap have it)."""

    def __len__(self) -> int: ...
    def __contains__(self, key: object) -> bool: ...
    def get(self, key: int, default: Any = None, /) -> Any: ...
    def get_many(self, keys: Sequence[int], default: Any, /) -> list[Any]: ...
    def keys(self) -> Iterable[int]: ...
    def items(self) -> Iterable[tuple[int, Any]]: ...
    def clear(self) -> None: ...
    def set_many(self, keys: Sequence[int], values: Sequence[Any], /) -> None: ...
    def or_bits(self, keys: Sequence[int], bit: int, /) -> None: ...
    def unset_bits(self, keys: Sequence[int], bit: int, /) -> int: ...
    def drop_bits(self, bit: int, /) -> int: ...
    def evict_oldest(self, max_keys: int, /) -> int: ...


class DictMap(dict[int, Any]):
    """U64Map's methods over a dict: any int keys and values (see the module)."""

    __slots__ = ()

    def get_many(self, keys: Sequence[int], default: Any, /) -> list[Any]:
        return list(map(self.get, keys, repeat(default, len(keys))))

    def set_many(self, keys: Sequence[int], values: Sequence[Any], /) -> None:
        self.update(zip(keys, values, strict=False))

    def or_bits(self, keys: Sequence[int], bit: int, /) -> None:
        # all new: one C-level update; but a decode step's event stores a block or two, and
        # a probe each costs less than building the keys view, the zip and the repeat
        if len(keys) > SMALL_EVENT and self.keys().isdisjoint(keys):
            self.update(zip(keys, repeat(bit)))
            return
        get = self.get
        for key in keys:
            m = get(key, 0)
            if not m & bit:
                self[key] = m | bit

    def unset_bits(self, keys: Iterable[int], bit: int, /) -> int:
        keep = ~bit
        n = 0
        get = self.get
        for key in keys:
            m = get(key)
            if m is not None and m & bit:
                n += 1
                m &= keep
                if m:
                    self[key] = m
                else:
                    del self[key]
        return n

    def drop_bits(self, bit: int, /) -> int:
        """The keys that hold `bit` are found by a C-level scan (map and compress, no
        Python step per key) and updated in place; a map that lost more than half its keys
        is rebuilt, since deleting never shrinks a dict's table."""
        before = len(self)
        n = self.unset_bits(list(compress(self, map(and_, self.values(), repeat(bit)))), bit)
        if len(self) < before // 2:
            kept = dict(self)
            self.clear()
            self.update(kept)
        return n

    def evict_oldest(self, max_keys: int, /) -> int:
        return evict_oldest(self, max_keys)


_U64Map: Callable[[], BlockMap] | None
try:  # native/_u64map.c, built where the machine can
    from heimdall_proxy.native._u64map import U64Map as _U64Map
except ImportError:  # pragma: no cover - the extension is built wherever CI runs
    _U64Map = None

NATIVE = _U64Map is not None


def new_map(wide: bool = False) -> BlockMap:
    """An empty map: a U64Map where it is built, unless `wide` (values past 64 bits)."""
    if _U64Map is not None and not wide:
        return _U64Map()
    return DictMap()


def maps_are_native() -> bool:
    """Whether new_map makes U64Maps (the extension is built, and no test turned it off)."""
    return _U64Map is not None


def is_native(table: BlockMap) -> bool:
    """Whether `table` is a U64Map (conductor.native_ingest writes only those)."""
    return _U64Map is not None and type(table) is _U64Map


def as_dict_map(table: BlockMap) -> DictMap:
    """`table` as a DictMap (itself if it is one), its order kept."""
    if type(table) is DictMap:
        return table
    return DictMap(table.items())


def warn_if_dict(log: logging.Logger) -> None:
    """Say, at the conductor's start, that its maps are dicts here (the extension is not
    built: it needs a C compiler at install time)."""
    if not NATIVE:
        log.warning(
            "the conductor's block maps are dicts here (native/_u64map.c was not built: it "
            "needs gcc at install time): ~3x the memory per block and slower ingest"
        )
