"""The gateway's in-flight ledger shared between gateway replicas, once per gateway.

llm-d shares the in-flight load on its inflight-load-producer (`syncCrossReplicaState`); the
readers (active-request-scorer, token-load-scorer, the detectors, the affinity filter, the
latency producer) then see every replica's counts through the one attribute they read. Here
the ledger (framework/inflight.py) publishes its per-pod totals (requests, tokens, whole
prompts, and each Measure a plugin keeps in it) through one set of replica counters
(counters.py), and takes the others' sums into the counts its readers read.

Who asks for the sharing: inflight-load-producer with a store (`redisConfig` /
`valkeyConfig`), and, as before the ledger was one, a scorer or filter with its own store
parameters. Each asks while it runs (`hold` at start, `release` at stop); the sharing is
the first producer's store, else the first other plugin's, and none while a producer says
`syncCrossReplicaState: false`. Across a config reload the new plugins hold before the old
ones release, so an unchanged store keeps its counters (and this replica its id): the
others never see this replica's counts drop and come back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.replicas import hub
from heimdall_proxy.replicas.counters import ReplicaCounters, Rider

log = logging.getLogger(__name__)

#: The ledger's keys under a store's key prefix: one name whatever the plugins are called,
#: so replicas whose configs differ in plugin names (or moved the store parameters from a
#: scorer to the producer) still count each other.
KEY_SPACE = "state:inflight-load-producer:ledger:"


@dataclass(frozen=True, slots=True)
class Store:
    """Where and how often the ledger is shared."""

    address: str
    key_prefix: str
    interval: float
    ttl: float


@dataclass(slots=True)
class _Holder:
    store: Store | None  # None: keep the ledger local
    #: 0: inflight-load-producer (wins); 1: another plugin's store parameters
    rank: int
    name: str


class _LedgerCounters(ReplicaCounters):
    """Replica counters that hand the others' sums to the ledger whenever they change."""

    __slots__ = ("_changed",)

    def __init__(self, changed: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._changed = changed

    def pushed(self, message: bytes) -> bool:
        taken = super().pushed(message)
        self._changed()
        return taken

    def take(self, flat: list[Any]) -> None:
        super().take(flat)
        self._changed()


class _Riders:
    """The events several plugins send with the ledger's pushes, each under its key."""

    __slots__ = ("riders",)

    def __init__(self) -> None:
        self.riders: dict[str, Rider] = {}

    def outgoing(self) -> Any:
        out = {k: p for k, r in self.riders.items() if (p := r.outgoing()) is not None}
        return out or None

    def incoming(self, payload: Any) -> None:
        if not isinstance(payload, dict):
            raise TypeError("a push's events are not keyed by rider")
        for key, events in payload.items():
            rider = self.riders.get(key)
            if rider is not None:
                rider.incoming(events)


class LedgerShare:
    """The replica sharing of one ledger (see the module). `counters` is set while shared."""

    __slots__ = ("_holders", "_lock", "_riders", "_seen", "_store", "counters", "load")

    def __init__(self, load: InFlightLoad) -> None:
        self.load = load
        self.counters: _LedgerCounters | None = None
        self._store: Store | None = None
        self._holders: dict[int, _Holder] = {}
        self._riders = _Riders()
        self._lock = asyncio.Lock()
        #: The others' sums the ledger last took (an identity: a new mapping is a change).
        self._seen: Mapping[str, float] | None = None

    @property
    def store(self) -> Store | None:
        return self._store

    def others(self) -> Mapping[str, float]:
        """The others' published sums (empty: not shared, or their counts went stale)."""
        return self.counters.others() if self.counters is not None else {}

    async def hold(self, owner: object, name: str, store: Store | None, rank: int) -> None:
        """`owner` (plugin `name`) wants the ledger shared through `store` (None: kept
        local) while it runs."""
        self._holders[id(owner)] = _Holder(store, rank, name)
        await self._settle()

    async def release(self, owner: object) -> None:
        if self._holders.pop(id(owner), None) is not None:
            await self._settle()

    def ride(self, key: str, rider: Rider | None) -> None:
        """`rider`'s events go out with the ledger's pushes under `key` (None: no more)."""
        if rider is None:
            self._riders.riders.pop(key, None)
        else:
            self._riders.riders[key] = rider

    def rider(self, key: str) -> Rider | None:
        return self._riders.riders.get(key)

    def _wanted(self) -> Store | None:
        holders = sorted(self._holders.values(), key=lambda h: h.rank)
        if any(h.store is None for h in holders if h.rank == 0):
            ignored = sorted({h.name for h in holders if h.store is not None})
            if ignored:
                log.warning(
                    "the in-flight ledger stays local (inflight-load-producer "
                    "syncCrossReplicaState: false): the store parameters of %s do not share it",
                    ", ".join(ignored),
                )
            return None
        stores = [h for h in holders if h.store is not None]
        if not stores:
            return None
        first = stores[0]
        differ = sorted({h.name for h in stores if h.store != first.store})
        if differ:
            log.warning(
                "the in-flight ledger is shared through %s's store; %s name another store, "
                "not used for it",
                first.name,
                ", ".join(differ),
            )
        return first.store

    async def _settle(self) -> None:
        async with self._lock:
            wanted = self._wanted()
            if wanted == self._store:
                return
            old, self.counters, self._store = self.counters, None, None
            if old is not None:
                self.load.poke = None
                await hub.leave(old)
                self._seen = None
                self.load.share_others({})
            if wanted is None:
                return
            counters = _LedgerCounters(
                self._others_changed,
                wanted.address,
                wanted.key_prefix + KEY_SPACE,
                self._published,
                wanted.interval,
                wanted.ttl,
            )
            counters.rider = self._riders
            self.counters, self._store = counters, wanted
            await hub.join(counters)
            self.load.poke = counters.changed
            log.info("the in-flight ledger is shared with the other replicas at %s", wanted.address)

    def _others_changed(self) -> None:
        counters = self.counters
        if counters is None:
            return
        others = counters.others()
        if others is not self._seen:
            self._seen = others
            self.load.share_others(others)

    def _published(self) -> dict[str, float]:
        """The ledger's totals for this tick; first, the others' sums are dropped when they
        went stale (no tick got through for the time to live: the store is unreachable, and
        this replica routes on its own counts, as counters.py says)."""
        self._others_changed()
        return self.load.published()


def share_of(load: InFlightLoad) -> LedgerShare:
    """The ledger's replica sharing (made on first use; one per ledger)."""
    share = load.share
    if not isinstance(share, LedgerShare):
        share = load.share = LedgerShare(load)
    return share
