"""A journal of routing-state changes that every gateway replica applies to its own copy.

The approximate prefix index and the no-hit LRU change on every request and are read on
every request, so each replica keeps its whole copy in memory (reads stay free) and the
replicas exchange their changes: records appended locally are sent as one stream entry per
tick (`XADD` with an approximate `MAXLEN`), and in the same pipelined round trip the entries
the others added since the last tick are read (`XREAD`) and handed to `apply`. A replica
that starts (or restarts) reads the retained history first, so it does not begin empty.

Records are msgpack-able lists; what they mean is the owner's business. Changes are applied
in stream order on every replica, their own ones first (locally, at once), so two replicas'
copies agree up to the records still in flight, i.e. up to about two ticks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import msgpack
import redis.asyncio as aioredis

from heimdall_proxy.replicas.ticker import Ticker

#: Stream entries read per round trip (a tick, or a step of the start-up catch-up).
READ_BATCH = 1000
#: Longest the start-up catch-up may take before the replica starts serving anyway.
CATCH_UP_SECONDS = 5.0


class Journal:
    """Appends this replica's records and applies the other replicas' (see the module).
    Owns `redis`: stop() closes it."""

    __slots__ = (
        "_apply",
        "_key",
        "_last",
        "_max",
        "_pending",
        "_redis",
        "_ticker",
        "applied",
        "dropped",
        "replica",
    )  # fmt: skip

    def __init__(
        self,
        redis: aioredis.Redis,
        key: str,
        apply: Callable[[list[Any]], None],
        interval: float,
        max_entries: int,
        replica: str | None = None,
    ) -> None:
        self.replica = (replica or uuid.uuid4().hex[:16]).encode()
        self._redis = redis
        self._key = key
        self._apply = apply
        self._max = max_entries
        self._pending: list[list[Any]] = []
        self._last = b"0-0"
        self._ticker = Ticker(f"journal {key}", interval, self.sync)
        #: Records applied from other replicas, and local records lost to a Redis outage.
        self.applied = 0
        self.dropped = 0

    def append(self, record: list[Any]) -> None:
        """Queue a record and ask for a tick soon (no I/O)."""
        self._pending.append(record)
        self._ticker.poke()

    async def sync(self) -> int:
        """Send the queued records and apply the others' new ones (one round trip). Returns
        the number of entries read. Records queued when Redis fails are dropped (counted in
        `dropped`): a long outage must not grow memory, and the index is approximate."""
        pending, self._pending = self._pending, []
        pipe = self._redis.pipeline(transaction=False)
        if pending:
            entry = {b"r": self.replica, b"d": msgpack.packb(pending)}
            pipe.xadd(self._key, entry, maxlen=self._max, approximate=True)  # type: ignore[arg-type]
        pipe.xread({self._key: self._last}, count=READ_BATCH)
        try:
            replies = await pipe.execute()
        except BaseException:
            self.dropped += len(pending)
            raise
        return self._take(replies[-1])

    def _take(self, reply: Any) -> int:
        n = 0
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                self._last = entry_id
                n += 1
                if fields.get(b"r") == self.replica:
                    continue
                records = msgpack.unpackb(fields[b"d"])
                for record in records:
                    self._apply(record)
                self.applied += len(records)
        return n

    async def start(self) -> None:
        """Catch up with the retained history (bounded in time), then tick in background."""
        deadline = time.monotonic() + CATCH_UP_SECONDS
        while time.monotonic() < deadline:
            try:
                if await self.sync() < READ_BATCH:
                    break
            except Exception:
                await self._ticker.once()  # logs the outage once
                break
        self._ticker.start()

    async def stop(self) -> None:
        await self._ticker.stop()
        try:
            if self._pending:
                await self._ticker.once()  # last records out
        finally:
            await self._redis.aclose()
