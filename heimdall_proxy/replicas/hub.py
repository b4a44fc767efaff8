"""One sync loop per process and store, shared by every plugin that shares state.

Each plugin that shares its state holds a part (counters or a journal). The parts naming the
same store address join one hub: one client and one background loop that makes a single
pipelined round trip per tick carrying every part's reads and writes:

- one script call (lua/counters.lua) publishing every set of counters and pulling the other
  replicas' totals for each;
- one `XADD` per journal with records queued since the last tick;
- one `XREAD` over every journal's stream (journals on the same stream, as in tests where
  two replicas live in one process, get one `XREAD` each).

So the request path still does no I/O, and the background cost no longer grows with the
number of plugins: most of a tick's CPU is the client's per-round-trip overhead (about
0.15-0.2 ms with redis-py). A hub ticks at the shortest `syncInterval` of its parts, and
sooner when a part is poked (at most every MIN_GAP).

A tick that carried a local change also publishes on the parts' channels, and every other
replica's hub listens there: each set of counters publishes the totals it just wrote, which
the others take as they arrive (no round trip of theirs); a journal that sent records
publishes the hub's id, and the others tick at once to read them. Without it a change made
on one replica reached the others only at their next tick, up to a `syncInterval` later: two
requests arriving at two replicas within that window were both routed as if the other did
not exist (bench/RESULTS.md, "one sync hub" and "decision trace"). An idle replica still
ticks every `syncInterval`, so a lost notification only delays, never loses, a change."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from heimdall_proxy.replicas.connect import client
from heimdall_proxy.replicas.counters import SCRIPT, ReplicaCounters
from heimdall_proxy.replicas.journal import Journal
from heimdall_proxy.replicas.part import Part
from heimdall_proxy.replicas.ticker import Ticker

#: Stream entries read per XREAD (a tick, or a step of a journal's start-up catch-up).
READ_BATCH = 1000
#: Longest a journal's start-up catch-up may take before the replica starts serving anyway.
CATCH_UP_SECONDS = 5.0

log = logging.getLogger(__name__)

#: Seconds the listener waits for a notification before it looks for new channels.
LISTEN_POLL = 0.5

_SHA = hashlib.sha1(SCRIPT.encode(), usedforsecurity=False).hexdigest()


def _streams(reply: Any) -> list[tuple[bytes, list[Any]]]:
    """XREAD's reply as (stream key, entries) pairs (RESP2 gives a list, RESP3 a map)."""
    if isinstance(reply, dict):
        return list(reply.items())
    return [(key, entries) for key, entries in reply or ()]


def _distinct_keys(journals: list[Journal]) -> list[list[Journal]]:
    """Journals split into XREAD groups that name each stream at most once."""
    groups: list[list[Journal]] = []
    for journal in journals:
        for group in groups:
            if all(j.key != journal.key for j in group):
                group.append(journal)
                break
        else:
            groups.append([journal])
    return groups


class SyncHub:
    """The parts sharing one store in this process, synced together (see the module). Owns
    its client: stop() closes it."""

    __slots__ = ("_background", "_counters", "_dirty", "_id", "_journals", "_listener", "_lock",
                 "_redis", "_stopping", "_ticker", "address", "users")  # fmt: skip

    def __init__(
        self, address: str, redis: aioredis.Redis | None = None, *, background: bool = True
    ) -> None:
        """`background=False`: no loop, sync() is called by hand (benches, tests)."""
        self.address = address
        self._background = background
        self._redis = redis if redis is not None else client(address)
        self._counters: list[ReplicaCounters] = []
        self._journals: list[Journal] = []
        # A tick, a catch-up read and a withdrawal never overlap: a part left out of a tick
        # in flight cannot be republished after it withdrew.
        self._lock = asyncio.Lock()
        self._ticker = Ticker(f"state at {address}", 1.0, self.sync)
        self._id = uuid.uuid4().hex[:16].encode()
        #: A local change is waiting for the next tick (which then notifies the others).
        self._dirty = False
        self._listener: asyncio.Task[None] | None = None
        self._stopping = False
        #: Parts joined through the registry (join / leave), including those still starting.
        self.users = 0

    @property
    def parts(self) -> list[Part]:
        return [*self._counters, *self._journals]

    @property
    def reachable(self) -> bool:
        return self._ticker.reachable

    def poke(self) -> None:
        """A local change: tick soon, and tell the other replicas to tick after it."""
        self._dirty = True
        self._ticker.poke()

    def channels(self) -> set[str]:
        """Where a tick with local changes is announced (one per part's state)."""
        return {p.channel for p in self.parts}

    async def add(self, part: Part) -> None:
        """Take `part` into every tick from now on, the background loop running. Counters
        are published and the others' pulled once before this returns; a journal first
        reads the retained history (bounded in time), so a restarted replica is not empty."""
        if part.hub is not None:
            raise RuntimeError("the part is in a hub already")
        part.hub = self
        if isinstance(part, Journal):
            await self._catch_up(part)
            self._journals.append(part)
        elif isinstance(part, ReplicaCounters):
            self._counters.append(part)
            await self._ticker.once()
        else:
            raise TypeError(f"not a shared part: {part!r}")
        self._ticker.interval = min(p.interval for p in self.parts)
        if self._background:
            self._ticker.start()
            if self._listener is None:
                self._listener = asyncio.create_task(
                    self._listen(), name=f"replicas:{self.address}"
                )

    async def remove(self, part: Part) -> None:
        """Leave `part` out of the ticks: a journal's last queued records are sent first,
        and counters are withdrawn at once (a clean stop need not wait for them to expire)."""
        if isinstance(part, Journal) and part.pending:
            await self._ticker.once()
        async with self._lock:
            if isinstance(part, Journal):
                self._journals.remove(part)
            elif isinstance(part, ReplicaCounters):
                self._counters.remove(part)
                hash_key, zset, member = part.withdraw_keys()
                pipe = self._redis.pipeline(transaction=False)
                pipe.delete(hash_key)
                pipe.zrem(zset, member)
                with contextlib.suppress(Exception):  # best effort: they expire anyway
                    await pipe.execute()
        part.hub = None
        if self.parts:
            self._ticker.interval = min(p.interval for p in self.parts)

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # Not cancelled: redis-py's get_message can absorb a cancellation and go on
            # waiting. The listener sees the flag within LISTEN_POLL and closes its pubsub.
            self._stopping = True
            try:
                await asyncio.wait_for(asyncio.shield(listener), LISTEN_POLL * 4)
            except TimeoutError:
                listener.cancel()
        await self._ticker.stop()
        await self._redis.aclose()

    async def _listen(self) -> None:
        """Tick when another replica announces a change on one of the parts' channels."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        subscribed: set[str] = set()
        failing = False
        try:
            while not self._stopping:
                try:
                    wanted = self.channels()
                    if wanted - subscribed:
                        await pubsub.subscribe(*(wanted - subscribed))
                        subscribed |= wanted
                    msg = await pubsub.get_message(timeout=LISTEN_POLL)
                    failing = False
                except (RedisError, OSError) as exc:
                    if not failing:  # the ticks log the outage; this only says why
                        log.debug("shared state at %s: notifications lost: %s", self.address, exc)
                    failing = True
                    subscribed = set()
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                    pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                    await asyncio.sleep(LISTEN_POLL)
                    continue
                if msg is not None:
                    self._notified(msg)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            # redis-py closes a pubsub connection without waiting for it: a loop turn lets
            # its transport finish closing before the loop may be closed
            await asyncio.sleep(0)

    def _notified(self, msg: dict[str, Any]) -> None:
        """Another replica's tick: take the counters it pushed, or tick to read its records
        (also when a push cannot be read: an older replica only names itself)."""
        channel, data = msg.get("channel"), msg.get("data")
        if isinstance(channel, bytes):
            channel = channel.decode()
        takers = [c for c in self._counters if c.channel == channel]
        # every taker takes it (a list, not a short-circuiting generator)
        if takers and isinstance(data, bytes) and all([c.pushed(data) for c in takers]):
            return
        if data != self._id:
            self._ticker.poke()

    async def sync(self) -> None:
        """One round trip for every part: publish what changed here, take in the others'."""
        async with self._lock:
            await self._round_trip(list(self._counters), list(self._journals))

    async def _round_trip(self, counters: list[ReplicaCounters], journals: list[Journal]) -> None:
        if not counters and not journals:
            return
        sent = [(j, out) for j in journals if (out := j.outgoing()) is not None]
        reads = _distinct_keys(journals)
        notify, self._dirty = self._dirty, False
        for attempt in (0, 1):
            pipe = self._redis.pipeline(transaction=False)
            if counters:
                keys = [c.zset for c in counters]
                args = [a for c in counters for a in c.script_args()]
                pipe.evalsha(_SHA, len(keys), *keys, *args)
            if attempt == 0:
                for j, (_records, entry) in sent:
                    pipe.xadd(j.key, entry, maxlen=j.max_entries, approximate=True)  # type: ignore[arg-type]
            for group in reads:
                pipe.xread({j.key: j.last for j in group}, count=READ_BATCH)
            if notify:  # last: the others read this tick's writes once told
                for c in counters:  # the totals themselves: taken without a round trip
                    pipe.publish(c.channel, c.push_message())
                if attempt == 0:  # new journal records: the others tick to read them
                    for channel in sorted({j.channel for j, _out in sent}):
                        pipe.publish(channel, self._id)
            try:
                replies = await pipe.execute()
            except NoScriptError:
                # The server lost the script (restart, SCRIPT FLUSH). The XADDs went
                # through (a pipeline is not a transaction): load it, redo the rest.
                if attempt:
                    raise
                await self._redis.script_load(SCRIPT)
                continue
            except BaseException:
                if attempt == 0:
                    for j, (records, _entry) in sent:
                        j.dropped += len(records)
                raise
            self._take(counters, replies, 0 if attempt else len(sent), reads)
            return

    @staticmethod
    def _take(
        counters: list[ReplicaCounters], replies: list[Any], n_sent: int, reads: list[list[Journal]]
    ) -> None:
        i = 0
        if counters:
            for part, flat in zip(counters, replies[0], strict=True):
                part.take(flat)
            i = 1
        first = i + n_sent
        for group, reply in zip(reads, replies[first : first + len(reads)], strict=True):
            by_key = {j.key.encode(): j for j in group}
            for key, entries in _streams(reply):
                by_key[key].take(entries)

    async def _catch_up(self, journal: Journal) -> None:
        deadline = time.monotonic() + CATCH_UP_SECONDS
        while time.monotonic() < deadline:
            try:
                async with self._lock:
                    reply = await self._redis.xread({journal.key: journal.last}, count=READ_BATCH)
            except (RedisError, OSError):
                await self._ticker.once()  # logs the outage once
                return
            n = 0
            for _key, entries in _streams(reply):
                journal.take(entries)
                n += len(entries)
            if n < READ_BATCH:
                return


#: The hubs of this process, per event loop and store address.
_hubs: dict[tuple[asyncio.AbstractEventLoop, str], SyncHub] = {}


async def join(part: Part) -> None:
    """Add `part` to this process's hub for its store (created on first use)."""
    if part.hub is not None:
        raise RuntimeError("the part is in a hub already")
    key = (asyncio.get_running_loop(), part.address)
    hub = _hubs.get(key)
    if hub is None:
        hub = _hubs[key] = SyncHub(part.address)
    hub.users += 1
    try:
        await hub.add(part)
    except BaseException:
        part.hub = None
        await _release(hub)
        raise


async def leave(part: Part) -> None:
    """Remove `part` from its hub; the last part out stops the hub and closes its client."""
    hub = part.hub
    if not isinstance(hub, SyncHub):  # not in one (the only kind a part joins)
        return
    try:
        await hub.remove(part)
    finally:
        await _release(hub)


async def _release(hub: SyncHub) -> None:
    hub.users -= 1
    if hub.users <= 0:
        key = (asyncio.get_running_loop(), hub.address)
        if _hubs.get(key) is hub:
            del _hubs[key]
        await hub.stop()
