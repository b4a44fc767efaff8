"""The cost of one sync round trip of the shared routing state (heimdall_proxy.replicas).

The request path does no Redis I/O. What sharing costs is the sync loop: one hub per process
and store, one pipelined round trip per tick carrying every shared plugin's state. Ticks come
every `syncInterval`, or sooner after a local change (at most every 5 ms). This script
measures, against a real Redis, the gateway-side CPU time and the wall time of one tick:

- a counters tick (publish 4 pods' totals, pull 1 other replica's);
- a journal tick with one routed prompt of 64 blocks to send and one from the other replica
  to apply;
- what config/recommended.yaml shares (two plugins' counters and one journal, as above):
  in one hub (one round trip), and with each plugin in a hub of its own (three round trips,
  as every plugin ran its own loop before the hub), interleaved tick by tick.

Each timed tick follows a local change (the hub poked), so it also publishes its
notification, as a tick under traffic does. The last row is what the other replica spends on
one such notification of a counters set: taking the pushed totals (since 2026-11-25; before,
it ticked, a round trip as in the first row). On code where a push carries a rider (the
affinity filter's prefix popularity, framework/popularity.py), recommended.yaml's affinity
counters carry one routed request's prefix key per tick, as they do under traffic, and a
last row times taking such a push.

It reports the mean over `--n` ticks, after a warm-up. Multiplying by the tick rate gives
the CPU share: e.g. 50 ticks/s when idle at the default 20 ms.

    python -m bench.replica_sync --n 3000
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from bench.harness import cli, machine
from heimdall_proxy.kvcache.index.redis import blob
from heimdall_proxy.replicas.connect import client
from heimdall_proxy.replicas.counters import ReplicaCounters
from heimdall_proxy.replicas.hub import SyncHub
from heimdall_proxy.replicas.journal import Journal

LOCAL = {f"pod-{i}": float(i + 1) for i in range(4)}
KEYS = blob(list(range(10**12, 10**12 + 64)))


class Replicas:
    """A set of shared parts on two replicas ("mine", timed, and "other"), each part of
    "mine" in one hub (`split=False`) or in a hub of its own (`split=True`)."""

    def __init__(
        self,
        address: str,
        prefix: str,
        counters: int,
        journals: int,
        split: bool,
        rider: bool = False,
    ):
        self.address, self.split = address, split
        self.mine = self._parts(prefix, counters, journals)
        self.other = self._parts(prefix, counters, journals)
        #: The first counters set carries the popularity rider (recommended.yaml's filter).
        self.popularity = popularity_rider(self.mine[0]) if rider and counters else None
        self.hubs: list[SyncHub] = []
        self.other_hub = SyncHub(address, background=False)

    def _parts(self, prefix: str, counters: int, journals: int) -> list[ReplicaCounters | Journal]:
        parts: list[ReplicaCounters | Journal] = [
            ReplicaCounters(self.address, f"{prefix}c{i}:", lambda: LOCAL, 60.0, 30.0)
            for i in range(counters)
        ]
        parts += [
            Journal(self.address, f"{prefix}j{i}", lambda r: None, 60.0, 10_000)
            for i in range(journals)
        ]
        return parts

    async def start(self) -> None:
        for part in self.other:
            await self.other_hub.add(part)
        groups = [[p] for p in self.mine] if self.split else [self.mine]
        for group in groups:
            hub = SyncHub(self.address, background=False)
            for part in group:
                await hub.add(part)
            self.hubs.append(hub)

    async def stop(self) -> None:
        for hub in [*self.hubs, self.other_hub]:
            for part in hub.parts:
                await hub.remove(part)
            await hub.stop()

    async def tick(self) -> tuple[float, float]:
        """The other replica routes a prompt and syncs (not timed); then this replica routes
        one and ticks: (CPU, wall) seconds of this replica's tick(s)."""
        for part in self.other:
            if isinstance(part, Journal):
                part.append(["pod-1", 31250, KEYS])
        await self.other_hub.sync()
        for part in self.mine:
            if isinstance(part, Journal):
                part.append(["pod-0", 31250, KEYS])
        if self.popularity is not None:
            self.popularity.observe(10**12 + 63)  # the routed request's shared prefix
        for hub in self.hubs:
            hub.poke()  # a local change: the tick notifies the others
        c0, w0 = time.process_time(), time.perf_counter()
        for hub in self.hubs:
            await hub.sync()
        return time.process_time() - c0, time.perf_counter() - w0


async def measure(address: str, n: int) -> dict[str, tuple[float, float]]:
    prefix = f"heimdall:bench-sync:{uuid.uuid4().hex[:8]}:"
    cases: dict[str, Replicas] = {
        "counters tick (4 pods, 1 other replica)": Replicas(address, prefix + "a:", 1, 0, False),
        "journal tick (64-block prompt out, one in)": Replicas(address, prefix + "b:", 0, 1, False),
        "recommended.yaml: 2 counters + 1 journal, one hub (1 round trip)": Replicas(
            address, prefix + "c:", 2, 1, False, rider=True
        ),
        "recommended.yaml: 2 counters + 1 journal, a hub each (3 round trips)": Replicas(
            address, prefix + "d:", 2, 1, True
        ),
    }
    totals = {name: [0.0, 0.0] for name in cases}
    try:
        for case in cases.values():
            await case.start()
        for phase in ("warm", "run"):
            count = n // 10 if phase == "warm" else n
            for name in totals:
                totals[name] = [0.0, 0.0]
            for _ in range(count):  # interleaved: load drift hits every case alike
                for name, case in cases.items():
                    cpu, wall = await case.tick()
                    totals[name][0] += cpu
                    totals[name][1] += wall
    finally:
        for case in cases.values():
            await case.stop()
        await drop(address, prefix)
    out = {name: (cpu / n * 1e6, wall / n * 1e6) for name, (cpu, wall) in totals.items()}
    pushed = take_pushes(address, n)
    if pushed is not None:
        out["the other replica takes a counters push (4 pods)"] = pushed
    pushed = take_pushes(address, n, rider=True)
    if pushed is not None:
        out["the other replica takes a counters push (4 pods) with one request's prefix"] = pushed
    return out


def popularity_rider(part: ReplicaCounters | Journal) -> Any:
    """The affinity filter's popularity rider on `part`, or None on code without riders."""
    try:
        from heimdall_proxy.framework.popularity import PrefixPopularity, SharedPopularity
    except ImportError:  # code from before the popularity moved out of the filter
        try:
            from heimdall_proxy.plugins.scheduling.filters.prefix_popularity import (  # type: ignore[no-redef]
                PrefixPopularity,
            )
            from heimdall_proxy.plugins.scheduling.filters.shared_popularity import (  # type: ignore[no-redef]
                SharedPopularity,
            )
        except ImportError:
            return None
    if not isinstance(part, ReplicaCounters) or not hasattr(part, "rider"):
        return None
    part.rider = SharedPopularity(PrefixPopularity())
    return part.rider


def take_pushes(address: str, n: int, rider: bool = False) -> tuple[float, float] | None:
    """(CPU, wall) microseconds the receiving replica spends on one pushed counters
    message (with `rider`: carrying one request's prefix key), or None on code without
    pushes (or riders)."""
    mine = ReplicaCounters(address, "x:", lambda: LOCAL, 60.0, 30.0)
    other = ReplicaCounters(address, "x:", lambda: {}, 60.0, 30.0)
    if not hasattr(other, "pushed"):
        return None
    sender = popularity_rider(mine) if rider else None
    if rider and (sender is None or popularity_rider(other) is None):
        return None
    messages = []
    for _ in range(n):
        mine.script_args()
        if sender is not None:
            sender.observe(10**12 + 63)
        messages.append(mine.push_message())
    c0, w0 = time.process_time(), time.perf_counter()
    for message in messages:
        other.pushed(message)
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6


async def drop(address: str, prefix: str) -> None:
    redis = client(address)
    try:
        keys_left = [k async for k in redis.scan_iter(match=prefix + "*", count=1000)]
        if keys_left:
            await redis.delete(*keys_left)
    finally:
        await redis.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--n", type=int, default=3000)
    cli.add_redis(parser)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    results = asyncio.run(measure(args.redis, args.n))
    print(f"commit {machine.git_head()}; load average {load:.2f}; n={args.n}")
    print("| tick | gateway CPU (us) | wall (us) |")
    print("|---|---:|---:|")
    for name, (cpu, wall) in results.items():
        print(f"| {name} | {cpu:.0f} | {wall:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
