"""A journal of routing-state changes that every gateway replica applies to its own copy.

The approximate prefix index and the no-hit LRU change on every request and are read on
every request, so each replica keeps its whole copy in memory (reads stay free) and the
replicas exchange their changes: records appended locally are sent as one stream entry per
tick (`XADD` with an approximate `MAXLEN`), and in the same pipelined round trip (the hub's,
shared with every other plugin's state) the entries the others added since the last tick are
read (one `XREAD` for every journal) and handed to `apply`. A replica that starts (or
restarts) reads the retained history first, so it does not begin empty.

Records are msgpack-able lists; what they mean is the owner's business. Changes are applied
in stream order on every replica, their own ones first (locally, at once), so two replicas'
copies agree up to the records still in flight, i.e. up to about two ticks."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import msgpack

from heimdall_proxy.replicas.part import Part


class Journal(Part):
    """Appends this replica's records and applies the other replicas' (see the module)."""

    __slots__ = ("_apply", "_pending", "applied", "dropped", "key", "last", "max_entries",
                 "replica")  # fmt: skip

    def __init__(
        self,
        address: str,
        key: str,
        apply: Callable[[list[Any]], None],
        interval: float,
        max_entries: int,
        replica: str | None = None,
    ) -> None:
        super().__init__(address, interval)
        self.replica = (replica or uuid.uuid4().hex[:16]).encode()
        self.key = key
        self.max_entries = max_entries
        self._apply = apply
        self._pending: list[list[Any]] = []
        #: The last stream entry read (XREAD continues after it).
        self.last = b"0-0"
        #: Records applied from other replicas, and local records lost to a Redis outage.
        self.applied = 0
        self.dropped = 0

    def append(self, record: list[Any], *, poke: bool = True) -> None:
        """Queue a record and ask for a tick soon (no I/O). `poke=False`: the record waits
        for the next tick, poked by something else or at most one interval away."""
        self._pending.append(record)
        if poke:
            self.poke()

    @property
    def channel(self) -> str:
        return self.key + ":tick"

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def outgoing(self) -> tuple[list[list[Any]], dict[bytes, bytes]] | None:
        """The queued records (now taken) and the stream entry carrying them, or None."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        return pending, {b"r": self.replica, b"d": msgpack.packb(pending)}

    def take(self, entries: list[Any]) -> None:
        """Apply the other replicas' records among stream `entries` (XREAD's, in order)."""
        for entry_id, fields in entries:
            self.last = entry_id
            if fields.get(b"r") == self.replica:
                continue
            records = msgpack.unpackb(fields[b"d"])
            for record in records:
                self._apply(record)
            self.applied += len(records)
