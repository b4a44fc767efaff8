"""What a plugin shares through a sync hub (counters or a journal): the part of the hub's
tick that is this plugin's, and the plugin's handle on the hub."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol


class Hub(Protocol):
    """What a part asks of the hub it is in (hub.py's SyncHub; declared here so that the
    parts and the hub do not import each other)."""

    @property
    def reachable(self) -> bool: ...

    def poke(self) -> None: ...

    async def sync(self) -> None: ...


class Part(ABC):
    """One plugin's shared state. Holds no connection: the hub that `address` names (one per
    process) carries every part's reads and writes in one round trip per tick."""

    __slots__ = ("address", "hub", "interval")

    def __init__(self, address: str, interval: float) -> None:
        self.address = address
        #: The part wants a tick at least this often (the hub ticks at its parts' shortest).
        self.interval = interval
        #: Set while the part is in a hub (between SyncHub.add and SyncHub.remove).
        self.hub: Hub | None = None

    @property
    @abstractmethod
    def channel(self) -> str:
        """Where replicas announce a change to this state (the hub listens there)."""

    def poke(self) -> None:
        """Something changed locally: ask the hub for a tick soon (no I/O)."""
        if self.hub is not None:
            self.hub.poke()

    async def sync(self) -> None:
        """One tick of the hub now (every part's, this one's included); raises what the
        round trip raises. Tests drive the sync with it."""
        if self.hub is None:
            raise RuntimeError("the shared state is not started")
        await self.hub.sync()

    @property
    def reachable(self) -> bool:
        """False while the store is unreachable (as of the last tick)."""
        return self.hub is None or self.hub.reachable
