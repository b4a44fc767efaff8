"""Precise prefix at scale: the file descriptors and the ingest rate of the KV-event feed
following N real ZMQ publishers.

The publishers are `heimdall_proxy.sim.kvfleet` processes (vLLM's wire format, a PUB socket
and a replay ROUTER per pod), N/`--fleets` pods each; this process runs the gateway's feed
(kvcache.subscriber with the plugin's defaults: a start-up catch-up from every pod's replay
socket, batches applied to an in-memory index with the plugin's apply_batch). Reported per
run: the descriptors of this process (`/proc/self/fd`) before the feed starts, at their peak
and once every pod's first block is in the index, against `subscriber.fd_budget(N)`; then
the ingest of `--batches` BlockStored batches per pod published at once: batches/s and this
process's CPU time per batch (`time.process_time`: the event loop and libzmq's I/O thread).

`--per-pod` follows each pod with a SUB socket of its own (the feed before the shared
socket); `--nofile N` lowers this process's soft limit of open files first (1,024 is
Linux's default soft limit; the CLI raises it to the hard limit at start-up).

Run: python -m bench.kv_fds [--pods 64 1024] [--fleets 8] [--per-pod] [--nofile 1024]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from bench.harness import cli
from bench.harness.machine import git_head
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.kvcache.events import EventBatch
from heimdall_proxy.kvcache.hashing import block_keys, namespace_seed
from heimdall_proxy.kvcache.index import InMemoryIndex
from heimdall_proxy.kvcache.prepare import apply_batch
from heimdall_proxy.kvcache.subscriber import KVEventsSubscriber, SubscriberOptions, fd_budget
from heimdall_proxy.sim.kvfleet import BLOCK, MODEL, block_tokens, pod_name


def open_fds() -> int:
    """This process's open descriptors; at the soft limit itself when none is left to list
    them with."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class StaticPods:
    """The pods of the fleets, as the gateway's pool would list them."""

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.list = endpoints
        self._by_name = {e.name: e for e in endpoints}

    def endpoints(self) -> list[Endpoint]:
        return self.list

    def get(self, name: str) -> Endpoint | None:
        return self._by_name.get(name)


class Fleets:
    """`fleets` kvfleet processes holding `pods` publishers between them."""

    def __init__(self, pods: int, fleets: int) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.pods: list[Endpoint] = []
        self.replay: dict[str, str] = {}
        per = -(-pods // fleets)
        for first in range(0, pods, per):
            n = min(per, pods - first)
            cmd = [sys.executable, "-m", "heimdall_proxy.sim.kvfleet", "--pods", str(n),
                   "--first", str(first)]  # fmt: skip
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)
        for proc in self.procs:
            assert proc.stdout is not None
            for row in json.loads(proc.stdout.readline()):
                i = len(self.pods)
                url = f"http://127.0.0.1:{20000 + i}"
                self.pods.append(Endpoint(row["name"], url, "127.0.0.1", 20000 + i,
                                          kv_events=row["endpoint"]))  # fmt: skip
                self.replay[row["name"]] = row["replay"]

    async def store(self, batches: int) -> None:
        """Every pod publishes `batches` BlockStored batches; returns when all are sent."""
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"store {batches}\n")
            proc.stdin.flush()
        loop = asyncio.get_running_loop()
        for proc in self.procs:
            assert proc.stdout is not None
            line = await loop.run_in_executor(None, proc.stdout.readline)
            assert line.strip() == "stored", line

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


@dataclass
class Run:
    pods: int
    mode: str
    nofile_soft: int
    fds_before: int = 0
    fds_peak: int = 0
    fds_followed: int = 0
    budget: int = 0
    pods_with_block: int = 0
    seconds_to_all: float = 0.0
    ingest_batches: int = 0
    batches_per_s: float = 0.0
    cpu_us_per_batch: float = 0.0
    failures: list[str] = field(default_factory=list)


async def measure(
    pods: int, fleets: int, shared: bool = True, batches: int = 0, within: float = 60.0
) -> Run:
    """Start the fleets and the feed, wait until every pod's first block is in the index
    (or `within` seconds), then time the ingest of `batches` batches per pod."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    run = Run(pods, "shared socket" if shared else "socket per pod", soft)
    fleet = Fleets(pods, fleets)
    index = InMemoryIndex(BLOCK)
    seed = namespace_seed(MODEL)

    #: The ingest phase ends when the index has counted this many batches.
    target = [1 << 62]
    ingested = asyncio.Event()

    async def apply(pod: str, batch: EventBatch) -> None:
        await apply_batch(index, pod, batch, MODEL)
        if index.stats.batches >= target[0]:
            ingested.set()

    options = SubscriberOptions(shared_socket=shared, catch_up=True, reconcile_interval=5.0)
    sub = KVEventsSubscriber(
        options, StaticPods(fleet.pods), apply, index.cleared, index.stats, index.flush,
        replay_address=lambda pod, endpoint: fleet.replay.get(pod),
    )  # fmt: skip
    run.budget = fd_budget(pods)
    run.fds_before = open_fds()
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            run.fds_peak = max(run.fds_peak, open_fds())
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    rounds = 0

    def holding() -> int:
        n = 0
        for i in range(pods):
            name = pod_name(i)
            if any(
                name in index.pods_holding(block_keys(block_tokens(i, j), BLOCK, seed)[0])
                for j in range(rounds)
            ):
                n += 1
        return n

    t0 = time.perf_counter()
    try:
        await sub.start()
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await fleet.store(1)  # ZMQ's slow joiner: publish until every pod is heard
            rounds += 1
            await asyncio.sleep(0.3)
            await sub.drain()
            run.pods_with_block = holding()
            if run.pods_with_block == pods:
                break
        run.seconds_to_all = time.perf_counter() - t0
        run.fds_followed = open_fds()
        run.failures = sorted({f"{run_.failures} failure(s): {run_.target}"
                               for run_ in sub._failing.values()})[:3]  # fmt: skip
        if batches and run.pods_with_block == pods:
            start = index.stats.batches
            target[0] = start + batches * pods
            c0, t1 = time.process_time(), time.perf_counter()
            await fleet.store(batches)
            with contextlib.suppress(TimeoutError):  # a PUB socket may drop: counted
                await asyncio.wait_for(ingested.wait(), within)
            await sub.drain()
            wall, cpu = time.perf_counter() - t1, time.process_time() - c0
            run.ingest_batches = index.stats.batches - start
            run.batches_per_s = run.ingest_batches / wall
            run.cpu_us_per_batch = cpu / max(1, run.ingest_batches) * 1e6
    finally:
        stop.set()
        await sampler
        await sub.stop()
        fleet.close()
    return run


def markdown(runs: list[Run]) -> str:
    rows = [
        "| pods | feed | soft limit | fds before | fds peak | fds followed | budget over before "
        "| pods with their block | batches/s | CPU µs/batch |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        rows.append(
            f"| {r.pods} | {r.mode} | {r.nofile_soft} | {r.fds_before} | {r.fds_peak} "
            f"| {r.fds_followed} | {r.budget} | {r.pods_with_block}/{r.pods} "
            f"| {r.batches_per_s:,.0f} | {r.cpu_us_per_batch:.0f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--pods", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--fleets", type=int, default=8)
    ap.add_argument("--batches", type=int, default=20_000,
                    help="batches published in the ingest phase, spread over the pods")  # fmt: skip
    ap.add_argument("--per-pod", action="store_true", help="a SUB socket per pod (before)")
    ap.add_argument("--nofile", type=int, default=0, help="lower the soft open-files limit")
    ap.add_argument("--within", type=float, default=60.0)
    ap.add_argument("--json", help="write the runs as JSON here")
    args = ap.parse_args(argv)
    if args.nofile:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
    runs: list[Run] = []
    for pods in args.pods:
        per_pod = max(1, args.batches // pods)
        runs.append(asyncio.run(measure(pods, args.fleets, not args.per_pod, per_pod, args.within)))
        print(json.dumps(asdict(runs[-1])), flush=True)
    load = os.getloadavg()
    print(f"commit {git_head()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(markdown(runs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in runs], f, indent=2)


if __name__ == "__main__":
    main()
