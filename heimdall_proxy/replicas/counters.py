"""Per-pod totals (requests or work in flight) summed over every live gateway replica.

Each replica publishes its own totals as a whole, never as deltas: a hash per replica
(`<prefix>r:<id>`, pod -> value) rewritten every tick with a time to live, and its id in a
sorted set (`<prefix>replicas`) scored by the server's clock. One script call per tick writes
the hash and returns the other live replicas' hashes, for every plugin's counters at once
(see hub.py), so a tick is one round trip whatever the number of replicas, pods or plugins.
A replica that dies stops refreshing its hash: its counts vanish after `ttl` (no delta is
left behind to undo), and a restarted one starts from zero. Requests read the last pulled
totals from memory: no I/O on the request path, at the price of up to one tick (plus the
other replica's tick) of staleness."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from heimdall_proxy.replicas.part import Part

SCRIPT = (resources.files(__package__) / "lua" / "counters.lua").read_text(encoding="utf-8")


class ReplicaCounters(Part):
    """The other replicas' per-pod totals, kept fresh by the hub's tick, which also
    publishes `local()` (this replica's per-pod totals)."""

    __slots__ = ("_local", "_others", "_pulled", "_ttl", "_ttl_ms", "prefix", "replica")

    def __init__(
        self,
        address: str,
        prefix: str,
        local: Callable[[], Mapping[str, float]],
        interval: float,
        ttl: float,
        replica: str | None = None,
    ) -> None:
        super().__init__(address, interval)
        self.replica = replica or uuid.uuid4().hex[:16]
        self.prefix = prefix
        self._local = local
        self._ttl = ttl
        self._ttl_ms = max(1, int(ttl * 1000))
        self._others: dict[str, float] = {}
        self._pulled = 0.0

    def others(self) -> Mapping[str, float]:
        """pod -> sum over the other live replicas, as of the last tick; empty when the last
        successful tick is older than the time to live (Redis unreachable: the others' counts
        would only grow staler, so this replica routes on its own)."""
        if time.monotonic() - self._pulled > self._ttl:
            return {}
        return self._others

    def changed(self) -> None:
        """This replica's totals changed: publish them at the next opportunity (MIN_GAP)."""
        self.poke()

    @property
    def zset(self) -> str:
        """The sorted set of live replicas (the script's key for this set of counters)."""
        return self.prefix + "replicas"

    @property
    def channel(self) -> str:
        return self.prefix + "tick"

    def script_args(self) -> list[str | int]:
        """This set's share of the script's ARGV: hash prefix, id, ttl, n, pod/value pairs."""
        pairs: list[str] = []
        for pod, value in self._local().items():
            if value:
                pairs += (pod, repr(float(value)))
        return [self.prefix + "r:", self.replica, self._ttl_ms, len(pairs) // 2, *pairs]

    def take(self, flat: list[Any]) -> None:
        """The script's reply for this set: the other replicas' pod/value pairs."""
        others: dict[str, float] = {}
        for i in range(0, len(flat) - 1, 2):
            pod = flat[i].decode()
            others[pod] = others.get(pod, 0.0) + float(flat[i + 1])
        self._others = others
        self._pulled = time.monotonic()

    def withdraw_keys(self) -> tuple[str, str, str]:
        """(hash, sorted set, member) to delete on a clean stop."""
        return self.prefix + "r:" + self.replica, self.zset, self.replica
