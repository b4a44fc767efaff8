"""Per-pod totals (requests or work in flight) summed over every live gateway replica.

Each replica publishes its own totals as a whole, never as deltas: a hash per replica
(`<prefix>r:<id>`, pod -> value) rewritten every tick with a time to live, and its id in a
sorted set (`<prefix>replicas`) scored by the server's clock. One script call per tick writes
the hash and returns the other live replicas' hashes, for every plugin's counters at once
(see hub.py), so a tick is one round trip whatever the number of replicas, pods or plugins.
A replica that dies stops refreshing its hash: its counts vanish after `ttl` (no delta is
left behind to undo), and a restarted one starts from zero. Requests read the last pulled
totals from memory: no I/O on the request path.

A tick with local changes also publishes the totals it wrote (`push_message`) on the
counters' channel, and the other replicas take them as they arrive (`pushed`), without a
round trip of their own. Pulling them at the receiver's next tick instead (as until
2026-11-25) left a change unseen for about 5-20 ms on a loaded host, long enough for two
replicas to pick the same idle pod (bench/RESULTS.md, "decision trace"). Every write
carries the replica's sequence number, so a pull that was read before a push arrived
cannot roll the pushed totals back.

A push can also carry a rider's payload (`Rider`): events the other replicas apply as the
push arrives, such as the affinity filter's count of requests per shared prefix. They cost
no round trip and no message of their own, and are delivered at most once, as a
notification is (a push lost to a broken connection loses them)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, Protocol

import msgpack

from heimdall_proxy.replicas.part import Part

log = logging.getLogger(__name__)

SCRIPT = (resources.files(__package__) / "lua" / "counters.lua").read_text(encoding="utf-8")
#: The hash field holding a replica's sequence number (no pod name starts with a NUL).
SEQ_FIELD = "\x00seq"
_SEQ = SEQ_FIELD.encode()


class Rider(Protocol):
    """Events that ride on a set of counters' pushes to the other replicas."""

    def outgoing(self) -> Any:
        """The events since the last push (msgpack-able; now taken), or None for none."""

    def incoming(self, payload: Any) -> None:
        """Apply another replica's events (`outgoing`'s, decoded); ValueError or TypeError
        for a payload that is not one (dropped and logged)."""


class ReplicaCounters(Part):
    """The other replicas' per-pod totals, kept fresh by the hub's tick, which also
    publishes `local()` (this replica's per-pod totals), and `rider`'s events with them."""

    __slots__ = ("_by_replica", "_ignored", "_local", "_others", "_pulled", "_sent", "_seq",
                 "_ttl", "_ttl_ms", "prefix", "replica", "rider")  # fmt: skip

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
        #: replica id -> (its sequence number, its per-pod totals), as last pulled or pushed
        self._by_replica: dict[str, tuple[int, dict[str, float]]] = {}
        self._pulled = 0.0
        self._seq = 0
        #: The pod/value pairs of the last script_args (what a push announces).
        self._sent: list[str] = []
        #: Ids left out of the others' totals (`ignore`).
        self._ignored: set[str] = set()
        #: Carried by every push from now on (set before the part joins a hub).
        self.rider: Rider | None = None

    def others(self) -> Mapping[str, float]:
        """pod -> sum over the other live replicas, as of the last tick; empty when the last
        successful tick is older than the time to live (Redis unreachable: the others' counts
        would only grow staler, so this replica routes on its own)."""
        if time.monotonic() - self._pulled > self._ttl:
            return {}
        return self._others

    def ignore(self, replica: str) -> None:
        """Leave `replica` out of the others' totals from now on: this process's other
        instance of the same plugin across a config reload (one replica, whose ledger the
        two instances share and only the new one publishes)."""
        self._ignored.add(replica)
        if self._by_replica.pop(replica, None) is not None:
            self._others = _sum(self._by_replica)

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
        """This set's share of the script's ARGV: hash prefix, id, ttl, n, pod/value pairs
        (the sequence number first, under SEQ_FIELD)."""
        self._seq += 1
        pairs: list[str] = [SEQ_FIELD, str(self._seq)]
        for pod, value in self._local().items():
            if value:
                pairs += (pod, repr(float(value)))
        self._sent = pairs
        return [self.prefix + "r:", self.replica, self._ttl_ms, len(pairs) // 2, *pairs]

    def push_message(self) -> bytes:
        """What the tick that ran script_args publishes on `channel`: the same totals, and
        the rider's events since the last push (taken now: a retried tick does not send
        them twice)."""
        payload = self.rider.outgoing() if self.rider is not None else None
        if payload is None:
            return msgpack.packb([self.replica, self._sent])  # type: ignore[no-any-return]
        return msgpack.packb([self.replica, self._sent, payload])  # type: ignore[no-any-return]

    def pushed(self, message: bytes) -> bool:
        """Take another replica's push (push_message); False when `message` is not one (an
        older replica's bare notification: the caller ticks instead). The rider's events
        are applied whatever the totals' sequence number: each push carries new ones."""
        try:
            replica, flat, *rest = msgpack.unpackb(message)
            if not isinstance(replica, str) or not isinstance(flat, list):
                return False
            seq, totals = _parse([f.encode() for f in flat])
        except (ValueError, TypeError, AttributeError, msgpack.UnpackException):
            return False
        if replica == self.replica or replica in self._ignored:
            return True
        known = self._by_replica.get(replica)
        if known is None or seq > known[0]:
            self._by_replica[replica] = (seq, totals)
            self._others = _sum(self._by_replica)
        if rest and self.rider is not None:
            try:
                self.rider.incoming(rest[0])
            except (ValueError, TypeError) as exc:
                log.debug("%s: a push's events from %s dropped: %s", self.prefix, replica, exc)
        return True

    def take(self, flat: list[Any]) -> None:
        """The script's reply for this set: each other live replica's id and totals. A
        replica missing from it is gone; one pushed more recently than this was read keeps
        its pushed totals."""
        by_replica: dict[str, tuple[int, dict[str, float]]] = {}
        i = 0
        while i < len(flat):
            replica, n = flat[i].decode(), int(flat[i + 1])
            if replica not in self._ignored:
                seq, totals = _parse(flat[i + 2 : i + 2 + n])
                known = self._by_replica.get(replica)
                by_replica[replica] = (
                    known if known is not None and known[0] > seq else (seq, totals)
                )
            i += 2 + n
        self._by_replica = by_replica
        self._others = _sum(by_replica)
        self._pulled = time.monotonic()

    def withdraw_keys(self) -> tuple[str, str, str]:
        """(hash, sorted set, member) to delete on a clean stop."""
        return self.prefix + "r:" + self.replica, self.zset, self.replica


def _parse(flat: list[bytes]) -> tuple[int, dict[str, float]]:
    """(sequence number, pod -> value) from a replica's flattened hash."""
    seq = 0
    totals: dict[str, float] = {}
    for i in range(0, len(flat) - 1, 2):
        if flat[i] == _SEQ:
            seq = int(flat[i + 1])
        else:
            totals[flat[i].decode()] = float(flat[i + 1])
    return seq, totals


def _sum(by_replica: Mapping[str, tuple[int, Mapping[str, float]]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for _seq, totals in by_replica.values():
        for pod, value in totals.items():
            out[pod] = out.get(pod, 0.0) + value
    return out
