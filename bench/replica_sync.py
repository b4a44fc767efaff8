"""The cost of one sync round trip of the shared routing state (heimdall_proxy.replicas).

The request path does no Redis I/O. What sharing costs is the sync loop: one round trip per
tick per shared plugin. Ticks come every `syncInterval`, or sooner after a local change (at
most every 5 ms). This script measures, against a real Redis, the gateway-side CPU time and
the wall time of one tick:

- a counters tick (publish 4 pods' totals, pull 1 other replica's);
- a journal tick with one routed prompt of 64 blocks to send and one from the other replica
  to apply.

It reports the mean over `--n` ticks, after a warm-up. Multiplying by the tick rate gives
the CPU share: e.g. 2 plugins x 50 ticks/s when idle at the default 20 ms.

    python bench/replica_sync.py --n 3000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import machine
from heimdall_proxy.kvcache.index.redis import blob
from heimdall_proxy.replicas.connect import client
from heimdall_proxy.replicas.counters import ReplicaCounters
from heimdall_proxy.replicas.journal import Journal


async def measure(address: str, n: int) -> dict[str, tuple[float, float]]:
    prefix = f"heimdall:bench-sync:{uuid.uuid4().hex[:8]}:"
    r1, r2 = client(address), client(address)
    local = {f"pod-{i}": float(i + 1) for i in range(4)}
    mine = ReplicaCounters(r1, prefix + "c:", lambda: local, 60.0, 30.0)
    other = ReplicaCounters(r2, prefix + "c:", lambda: local, 60.0, 30.0)
    applied: list[object] = []
    j_mine = Journal(r1, prefix + "j", applied.append, 60.0, 10_000)
    j_other = Journal(r2, prefix + "j", applied.append, 60.0, 10_000)
    keys = blob(list(range(10**12, 10**12 + 64)))
    out: dict[str, tuple[float, float]] = {}
    try:
        await other.sync()
        for name, step in (
            ("counters tick (4 pods, 1 other replica)", mine.sync),
            ("journal tick (64-block prompt out, one in)", None),
        ):
            for phase in ("warm", "run"):
                count = n // 10 if phase == "warm" else n
                cpu = wall = 0.0
                for _ in range(count):
                    if step is None:
                        j_other.append(["pod-1", 31250, keys])
                        await j_other.sync()  # the other replica's record, not timed
                        j_mine.append(["pod-0", 31250, keys])
                    c0, w0 = time.process_time(), time.perf_counter()
                    await (step() if step is not None else j_mine.sync())
                    cpu += time.process_time() - c0
                    wall += time.perf_counter() - w0
                if phase == "run":
                    out[name] = (cpu / count * 1e6, wall / count * 1e6)
    finally:
        keys_left = [k async for k in r1.scan_iter(match=prefix + "*", count=1000)]
        if keys_left:
            await r1.delete(*keys_left)
        await r1.aclose()
        await r2.aclose()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
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
