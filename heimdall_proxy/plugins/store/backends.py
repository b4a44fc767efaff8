"""Where responses-store keeps its entries: the backend contract and the in-memory backend.
The Redis (+ MongoDB) backend is in tiered.py."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import orjson

#: How an entry that continues a conversation begins: `{"prev":"<previous response id>",...`
#: (the plugin writes the link first, so a backend reads it without decoding the entry).
LINK_PREFIX = b'{"prev":"'


def entry_link(entry: bytes) -> str | None:
    """The previous response id an entry links to; None for the first turn of a conversation
    (or an entry written before entries were linked, which holds its whole history)."""
    if not entry.startswith(LINK_PREFIX):
        return None
    start = len(LINK_PREFIX)
    end = entry.find(b'"', start)
    link = entry[start:end]
    if end < 0 or b"\\" in link:  # an escaped character: let the JSON decoder read it
        doc = orjson.loads(entry)
        prev = doc.get("prev") if isinstance(doc, dict) else None
        return prev if isinstance(prev, str) else None
    return link.decode()


class StoreBackend(Protocol):
    """Opaque entries (serialised JSON) by response id. Every method may raise when the
    backing service is unreachable; the plugin decides what that means for the request."""

    #: Entries larger than this are not stored (the plugin checks before put()).
    max_entry_bytes: int

    async def start(self) -> None:
        """Open connections and start background work."""
        ...

    async def stop(self) -> None:
        """Stop background work and close connections."""
        ...

    async def put(self, response_id: str, entry: bytes) -> None: ...

    async def get(self, response_id: str) -> bytes | None:
        """The entry, or None when unknown, expired or deleted."""
        ...

    async def delete(self, response_id: str) -> bool:
        """False when there was no such entry."""
        ...

    async def chain(self, response_id: str, limit: int) -> list[bytes]:
        """The entry under `response_id`, then the entries its links lead to (entry_link),
        newest first, at most `limit`. Stops after an entry without a link, and before a link
        to an entry it does not have (unknown, expired, deleted): the caller tells a broken
        chain by the last entry's link. Every entry returned counts as read now (LRU) and has
        its ttl renewed, so a conversation in use does not expire under its latest turn."""
        ...


class InMemoryBackend:
    """A process-local LRU: at most `max_entries` entries and `max_total_bytes` bytes of them,
    each dropped `ttl` seconds after it was stored (0: never). Reading an entry makes it the
    most recently used. Not shared between gateway replicas and lost on restart."""

    def __init__(
        self,
        ttl: float,
        max_entries: int,
        max_entry_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        max_total_bytes: int = 1 << 30,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.max_entry_bytes = max_entry_bytes
        self.max_total_bytes = max_total_bytes
        self.total_bytes = 0
        self._clock = clock
        #: id -> (deadline, entry, its link), least recently used first
        self._entries: OrderedDict[str, tuple[float, bytes, str | None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def set_limits(self, other: InMemoryBackend) -> None:
        """Take `other`'s limits (a reload's new parameters): the count and size limits from
        the next put on, the ttl for entries stored from now on."""
        self.ttl = other.ttl
        self.max_entries = other.max_entries
        self.max_entry_bytes = other.max_entry_bytes
        self.max_total_bytes = other.max_total_bytes

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def put(self, response_id: str, entry: bytes) -> None:
        now = self._clock()
        deadline = now + self.ttl if self.ttl > 0 else float("inf")
        entries = self._entries
        old = entries.get(response_id)
        if old is not None:
            self.total_bytes -= len(old[1])
        entries[response_id] = (deadline, entry, entry_link(entry))
        self.total_bytes += len(entry)
        entries.move_to_end(response_id)
        # Expired entries are dropped when read; also drop the ones at the cold end here so
        # a store that is only written does not keep them until LRU eviction.
        while entries:
            oldest_id, (oldest_deadline, oldest, _) = next(iter(entries.items()))
            if (
                oldest_deadline > now
                and len(entries) <= self.max_entries
                and self.total_bytes <= self.max_total_bytes
            ):
                break
            del entries[oldest_id]
            self.total_bytes -= len(oldest)

    async def get(self, response_id: str) -> bytes | None:
        item = self._entries.get(response_id)
        if item is None:
            return None
        deadline, entry, _ = item
        if deadline <= self._clock():
            del self._entries[response_id]
            self.total_bytes -= len(entry)
            return None
        self._entries.move_to_end(response_id)
        return entry

    async def chain(self, response_id: str, limit: int) -> list[bytes]:
        now = self._clock()
        deadline = now + self.ttl if self.ttl > 0 else float("inf")
        entries = self._entries
        found: list[bytes] = []
        rid: str | None = response_id
        while rid is not None and len(found) < limit:
            item = entries.get(rid)
            if item is None:
                break
            if item[0] <= now:
                del entries[rid]
                self.total_bytes -= len(item[1])
                break
            if item[0] < deadline:
                entries[rid] = (deadline, item[1], item[2])
            # walked newest first: each ancestor ends up more recent than its descendants,
            # harmless, as the whole chain is recent
            entries.move_to_end(rid)
            found.append(item[1])
            rid = item[2]
        return found

    async def delete(self, response_id: str) -> bool:
        item = self._entries.pop(response_id, None)
        if item is not None:
            self.total_bytes -= len(item[1])
        return item is not None and item[0] > self._clock()
