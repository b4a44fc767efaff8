"""KV cache indexer service (conductor) benchmark: ingest (events/s, blocks/s) and query
latency (p50/p99) of an 8k-token query at 64 instances x 100k blocks each, in memory.

Ingest, two paths, each into a fresh conductor holding `--instances` x `--blocks` blocks:

* vLLM     - what a vLLM (or SGLang) batch costs once off its ZMQ socket: msgpack decode,
             normalisation to standardized events, the standard hashes recomputed from the
             token ids (XXH3-64, seed 1337), the index and the engine-hash map. Each event
             stores 32 blocks of 16 tokens chained on the instance's previous event.
* standard - events that carry standard sequence hashes (no token ids): the index alone.

Query: a prompt of `--prompt-tokens` tokens (512 blocks of 16) that instance i holds the
first (i+1)/instances of (every instance is in the walk for part of it), against the index
built by the vLLM path (so it holds 64 x 100k blocks besides). `query` times
Conductor.query with the token ids (hashing the prompt included); `query_by_hash` with the
hashes given; `a cold prompt` one of the same size that no instance holds (the walk stops
at its first chunk, and only that chunk is hashed); `HTTP /query` a whole POST through
aiohttp on localhost (client in the same process and on the same two CPUs as the server;
encoding the body with orjson, checking and decoding it on the server included). Each
latency row also gives the thread's CPU time per call and how many calls over 1 ms were
preempted (an involuntary context switch while they ran): on a shared machine that tells
a p99 the other jobs made from one the code made.

Memory: the process's resident size grown by the vLLM path's ingest, per block (the index,
the engine-hash maps and what the allocator kept of the garbage). Each ingest starts with
the memory earlier rows freed given back to the system (glibc's malloc_trim): otherwise a
row runs faster or slower depending on the pages an earlier one left behind.

`--without maps` runs the conductor on DictMap (dicts, as without native/_u64map.c),
`--without tokens` decodes token ids as lists of ints (as without native/_tokens.c),
`--without native` decodes and applies every vLLM batch in Python (as without
native/_vllm_ingest.c): with and without, run one after the other, give each
extension's share on the same machine.

Run: python -m bench.conductor [--instances 64] [--blocks 100000] [--workers 0,1,2]
[--only-ingest] [--without maps] [--without tokens] [--without native]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import os
import platform
import random
import resource
import time
from pathlib import Path
from typing import Any

import msgpack
import orjson

from bench.harness import cli
from bench.harness.machine import cpu_model, git_head
from bench.harness.procs import bench_module
from bench.harness.stats import distribution

try:  # older trees (a base to compare with) have none: --without is refused there
    from heimdall_proxy.conductor import tables
    from heimdall_proxy.kvcache import events as kv_events
except ImportError:
    tables = kv_events = None  # type: ignore[assignment]
try:
    from heimdall_proxy.conductor import native_ingest
except ImportError:
    native_ingest = None  # type: ignore[assignment]
from heimdall_proxy.conductor.api import parse_query
from heimdall_proxy.conductor.hashing import seq_hashes
from heimdall_proxy.conductor.model import Registration, Stored, Stream
from heimdall_proxy.conductor.service import Conductor
from heimdall_proxy.kvcache.events import decode_batch

BLOCK = 16
BLOCKS_PER_EVENT = 32
MODEL = "bench-model"


def registrations(conductor: Conductor, instances: int) -> list[Registration]:
    regs = []
    for i in range(instances):
        reg = Registration(
            "tcp://127.0.0.1:1", None, "vLLM", MODEL, "", "default", f"vllm-{i}", BLOCK, 0, ""
        )
        conductor.registrations[reg.key] = reg  # not followed: the benchmark feeds it
        regs.append(reg)
    return regs


def vllm_payloads(
    regs: list[Registration], blocks: int, per_event: int = BLOCKS_PER_EVENT, per_batch: int = 1
) -> list[tuple[str, bytes]]:
    """(publisher, msgpack batch) in vLLM's array shape, round-robin over the instances,
    `per_batch` events of `per_event` blocks each (a prefill stores many blocks in one event;
    a decode step one block per sequence that filled one, so the events of a batch continue
    `per_batch` different chains); engine hashes random u64 (vLLM's are sha256-derived),
    tokens distinct per event."""
    rng = random.Random(1)
    last: dict[tuple[str, int], int | None] = {}
    pending: dict[str, list[Any]] = {}
    out = []
    per_tokens = per_event * BLOCK
    for e in range(len(regs) * (blocks // per_event)):
        key = regs[e % len(regs)].key
        hashes = [rng.getrandbits(64) for _ in range(per_event)]
        base = (e * 7919) % 100_000
        events = pending.setdefault(key, [])
        chain = (key, len(events))
        event = ["BlockStored", hashes, last.get(chain), list(range(base, base + per_tokens)),
                 BLOCK, None, "GPU", None]  # fmt: skip
        last[chain] = hashes[-1]
        events.append(event)
        if len(events) == per_batch:
            out.append((key, msgpack.packb([time.time(), events, 0])))
            del pending[key]
    out.extend((key, msgpack.packb([time.time(), evs, 0])) for key, evs in pending.items())
    return out


async def ingest_vllm(conductor: Conductor, payloads: list[tuple[str, bytes]]) -> float:
    """Each payload prepared as the event loop prepares it (ingest workers off: a plain
    batch scanned for the native path, else decoded) and applied."""
    prepare: Any = decode_batch if native_ingest is None else native_ingest.prepare
    gc.collect()
    t0 = time.perf_counter()
    for key, payload in payloads:
        await conductor.apply(key, prepare(payload))
    return time.perf_counter() - t0


def release_memory() -> None:
    """Collect garbage and give the freed memory back to the system (see the docstring)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: pages may be reused
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _rss() -> int:
    """This process's resident size, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def vllm_row(
    what: str, instances: int, blocks: int, per_event: int = BLOCKS_PER_EVENT, per_batch: int = 1
) -> tuple[Conductor, list[Registration], str, str]:
    """A fresh conductor fed vllm_payloads(...) on the loop (decode + apply), its row, and a
    row for the memory its ingest took."""
    conductor = Conductor()
    regs = registrations(conductor, instances)
    payloads = vllm_payloads(regs, blocks, per_event, per_batch)
    release_memory()
    rss = _rss()
    seconds = asyncio.run(ingest_vllm(conductor, payloads))
    gc.collect()
    grown = _rss() - rss
    del payloads
    gc.collect()
    total = conductor.stats.stored_blocks
    row = (
        f"| ingest, {what} | {conductor.events.stored / seconds:,.0f} events/s | "
        f"{total / seconds / 1e6:.2f}M blocks/s | {total:,} blocks in {seconds:.2f} s |"
    )
    memory = (
        f"| memory, {what}: resident size grown by the ingest | {grown / 2**20:,.0f} MiB | "
        f"{grown / total:.0f} bytes/block | {total:,} blocks |"
    )
    return conductor, regs, row, memory


def _proc_cpu(pid: int) -> float:
    """utime + stime of process `pid` in seconds (/proc), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def ingest_pipeline(
    workers: int, instances: int, blocks: int, per_event: int = BLOCKS_PER_EVENT, per_batch: int = 1
) -> tuple[float, float, float, int, int]:
    """The subscriber's whole path (queue, prepare, apply) into a fresh conductor with
    `workers` ingest processes: (wall s, this process's CPU s, workers' CPU s, blocks,
    events), timed from the first batch handed over to the last one queryable."""
    from heimdall_proxy.conductor.service import ServiceOptions

    conductor = Conductor(ServiceOptions(ingest_workers=workers))
    regs = registrations(conductor, instances)
    payloads = vllm_payloads(regs, blocks, per_event, per_batch)
    await conductor.start()
    try:
        pools = conductor.preparer._pools
        for pool in pools:  # spawned and imported before the clock starts
            await asyncio.wrap_future(pool.submit(int))
        pids = [pid for pool in pools for pid in (pool._processes or {})]
        release_memory()
        w0 = sum(map(_proc_cpu, pids))
        c0 = time.process_time()
        t0 = time.perf_counter()
        for key, payload in payloads:
            await conductor.subscriber.feed(key, payload)
        await conductor.subscriber.drain()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        wcpu = sum(map(_proc_cpu, pids)) - w0
    finally:
        await conductor.stop()
    return wall, cpu, wcpu, conductor.stats.stored_blocks, conductor.events.stored


async def burst_lag(instances: int, blocks: int, burst: int = 512) -> list[float]:
    """How late a 0.5 ms timer fires while bursts of `burst` vLLM batches (decoded and
    applied on the event loop) arrive 50 ms apart: what a query or request on the same
    loop waits behind the ingest, in seconds per tick."""
    conductor = Conductor()
    regs = registrations(conductor, instances)
    payloads = vllm_payloads(regs, blocks)
    await conductor.start()
    lags: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            t0 = time.perf_counter()
            await asyncio.sleep(0.0005)
            lags.append(time.perf_counter() - t0 - 0.0005)

    tick = asyncio.create_task(ticker())
    try:
        for i in range(0, len(payloads), burst):
            for key, payload in payloads[i : i + burst]:
                await conductor.subscriber.feed(key, payload)
            await asyncio.sleep(0.05)
        await conductor.subscriber.drain()
    finally:
        done = True
        await tick
        await conductor.stop()
    return lags


def ingest_standard(conductor: Conductor, regs: list[Registration], blocks: int) -> float:
    events: list[tuple[str, Stored]] = []
    rng = random.Random(2)
    for e in range(len(regs) * (blocks // BLOCKS_PER_EVENT)):
        reg = regs[e % len(regs)]
        stream = Stream(reg.namespace(), reg.instance_id, "gpu", 0)
        hashes = [rng.getrandbits(64) for _ in range(BLOCKS_PER_EVENT)]
        events.append((reg.key, Stored(stream, e, hashes)))
    release_memory()
    t0 = time.perf_counter()
    for key, ev in events:
        conductor.apply_events(key, (ev,))
    return time.perf_counter() - t0


def stagger(conductor: Conductor, regs: list[Registration], prompt: list[int]) -> None:
    """Instance i holds the first (i+1)/n of the prompt (engine hashes 1..n_blocks)."""
    n_blocks = len(prompt) // BLOCK
    for i, reg in enumerate(regs):
        held = max(1, n_blocks * (i + 1) // len(regs))
        event = ["BlockStored", list(range(1, held + 1)), None, prompt[: held * BLOCK],
                 BLOCK, None, "GPU", None]  # fmt: skip
        batch = decode_batch(msgpack.packb([time.time(), [event], 0]))
        asyncio.run(conductor.apply(reg.key, batch))


def _switches() -> int:
    """Times this process was preempted so far (involuntary context switches)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def _latency_row(
    name: str, wall: list[float], cpu: list[float], preempted: list[bool], count: str
) -> str:
    """A latency row: wall-clock percentiles, and what the other jobs on the machine did to
    them: the thread's CPU time per call (what the code costs with a core of its own), and
    how many calls over 1 ms were preempted (an involuntary context switch during the call)."""
    p50, p99, worst = percentiles(wall)
    c50, c99, _ = percentiles(cpu)
    slow = [p for w, p in zip(wall, preempted, strict=True) if w > 1e-3]
    return (
        f"| {name} | p50 {p50:.3f} ms | p99 {p99:.3f} ms | max {worst:.3f} ms, {count}; CPU "
        f"p50 {c50:.3f} / p99 {c99:.3f} ms; over 1 ms: {len(slow)}, {sum(slow)} of them "
        f"preempted |"
    )


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max of `samples` (seconds) in ms."""
    d = distribution(samples, scale=1e3)
    return d["p50"], d["p99"], d["max"]


async def _post_loop(url: str, body: dict[str, Any], n: int) -> list[float]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as http:
        headers = {"content-type": "application/json"}
        for i in range(n + 20):
            data = orjson.dumps(body)
            t0 = time.perf_counter()
            async with http.post(url, data=data, headers=headers) as resp:
                raw = await resp.read()
                assert resp.status == 200, raw
            if i >= 20:  # warm-up
                out.append(time.perf_counter() - t0)
            orjson.loads(raw)
    return out


def client_main(url: str, n: int, tokens: int) -> int:
    """The HTTP client, run as its own process (--client): prints the latencies as JSON."""
    prompt = [random.Random(3).randrange(128_000) for _ in range(tokens)]
    body = {"model": MODEL, "token_ids": prompt, "block_size": BLOCK}
    print(orjson.dumps(asyncio.run(_post_loop(url, body, n))).decode())
    return 0


async def http_latency(
    conductor: Conductor, body: dict[str, Any], n: int, separate: bool
) -> tuple[list[float], tuple[list[float], list[float], list[bool]]]:
    """End-to-end latencies of POST /query, and the server's handling time of each (from the
    handler's start to its response built: body read, JSON, checks, hashing, index,
    answer). `separate`: the client is another process, so only the server's own time is
    spent in this one."""
    from aiohttp import web

    from heimdall_proxy.conductor.app import CONDUCTOR, create_app

    app = create_app()
    app[CONDUCTOR] = conductor  # the populated one (its subscriber is started, unused)
    handled: list[float] = []
    handled_cpu: list[float] = []
    preempted: list[bool] = []

    @web.middleware
    async def timed(request: web.Request, handler: Any) -> web.StreamResponse:
        s0 = _switches()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        try:
            return await handler(request)  # type: ignore[no-any-return]
        finally:
            handled.append(time.perf_counter() - t0)
            handled_cpu.append(time.thread_time() - c0)
            preempted.append(_switches() > s0)

    app.middlewares.insert(0, timed)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}/query"
    try:
        if separate:
            proc = await asyncio.create_subprocess_exec(
                *bench_module("bench.conductor"), "--client", url,
                "--http-queries", str(n), "--prompt-tokens", str(len(body["token_ids"])),
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate()
            assert proc.returncode == 0
            e2e: list[float] = orjson.loads(out)
        else:
            e2e = await _post_loop(url, body, n)
    finally:
        await runner.cleanup()
    return e2e, (handled[20:], handled_cpu[20:], preempted[20:])


def main() -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=100_000, help="blocks per instance")
    ap.add_argument("--prompt-tokens", type=int, default=8192)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--http-queries", type=int, default=300)
    ap.add_argument(
        "--workers",
        default=f"0,{max(1, (os.cpu_count() or 1) - 1)}",
        help="ingest worker process counts, one pipeline row each (0: on the event loop; "
        "-1 or empty: no pipeline rows)",
    )
    ap.add_argument(
        "--only-ingest", action="store_true", help="the vLLM ingest rows only, no queries"
    )
    ap.add_argument(
        "--without",
        action="append",
        choices=["maps", "tokens", "native"],
        default=[],
        help="run without a C extension: maps (native/_u64map.c: dicts instead), tokens "
        "(native/_tokens.c: token ids as lists of ints), native (native/_vllm_ingest.c: "
        "every batch decoded and applied in Python); repeatable",
    )
    ap.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        return client_main(args.client, args.http_queries, args.prompt_tokens)
    if args.without and (tables is None or not hasattr(kv_events, "_pack_token_ids")):
        ap.error("--without: this tree has no such extensions")
    if "maps" in args.without:
        tables._U64Map = None
    if "tokens" in args.without:
        kv_events._pack_token_ids = None
    if "native" in args.without:
        if native_ingest is None:
            ap.error("--without native: this tree has no native ingest")
        native_ingest._vllm_ingest = None

    load = os.getloadavg()
    rows: list[str] = []

    standard = Conductor()
    regs = registrations(standard, args.instances)
    seconds = ingest_standard(standard, regs, args.blocks)
    total = standard.stats.stored_blocks
    events = standard.events.stored
    rows.append(
        f"| ingest, standard events (hashes given) | {events / seconds:,.0f} events/s "
        f"| {total / seconds / 1e6:.2f}M blocks/s | {total:,} blocks in {seconds:.2f} s |"
    )
    # what a publisher's restart or unregistering costs the event loop at this size
    reg = regs[len(regs) // 2]
    t0 = time.perf_counter()
    dropped = standard.index.drop_source(reg.tenant_id, (reg.instance_id, reg.dp_rank), reg.key)
    stall = time.perf_counter() - t0
    rows.append(
        f"| drop one publisher's blocks (restart, unregister), event loop held | "
        f"{stall * 1e3:.0f} ms | - | {dropped:,} of {total:,} blocks |"
    )
    del standard
    gc.collect()

    # the 32-block conductor is kept: the queries below run on it
    conductor, regs, row, memory = vllm_row(
        "vLLM batches (decode + rehash tokens)", args.instances, args.blocks
    )
    rows += [row, memory]
    # decode-phase traffic: each sequence that filled a block in a step, one event of one block
    _, _, row, _ = vllm_row(
        "vLLM decode-step batches (8 events of 1 block), decode + apply",
        args.instances,
        args.blocks // 5,
        per_event=1,
        per_batch=8,
    )
    rows.append(row)
    gc.collect()

    counts = sorted({int(w) for w in args.workers.split(",") if w.strip() and int(w) >= 0})
    # 32-block events over all the blocks, then decode-step batches over a fifth of them
    for what, blocks, shape in (
        ("vLLM batches", args.blocks, (BLOCKS_PER_EVENT, 1)),
        ("vLLM decode-step batches", args.blocks // 5, (1, 8)),
    ):
        for workers in counts:
            wall, cpu, wcpu, total, events = asyncio.run(
                ingest_pipeline(workers, args.instances, blocks, *shape)
            )
            gc.collect()
            label = (
                f"{workers} worker process{'es' if workers != 1 else ''}"
                if workers
                else ("on the event loop")
            )
            rows.append(
                f"| ingest, {what} through the subscriber, {label} | {events / wall:,.0f} "
                f"events/s | {total / wall / 1e6:.2f}M blocks/s | {total:,} blocks in "
                f"{wall:.2f} s; CPU: loop process {cpu:.2f} s ({total / cpu / 1e6:.2f}M "
                f"blocks/CPU-s), workers {wcpu:.2f} s |"
            )

    lags = asyncio.run(burst_lag(args.instances, 2_000))
    p50, p99, worst = percentiles(lags)
    rows.append(
        f"| event loop lag while bursts of 512 vLLM batches are applied on it | p50 "
        f"{p50:.3f} ms | p99 {p99:.3f} ms | max {worst:.3f} ms, {len(lags)} ticks of a 0.5 ms "
        f"timer, {args.instances} x 2,000 blocks in bursts 50 ms apart |"
    )

    if args.only_ingest:
        report(args, load, rows)
        return 0
    prompt = [random.Random(3).randrange(128_000) for _ in range(args.prompt_tokens)]
    stagger(conductor, regs, prompt)
    body = {"model": MODEL, "token_ids": prompt, "block_size": BLOCK}
    query = parse_query(body, False, 1 << 20, 1 << 16)
    hashed = parse_query(
        {"model": MODEL, "seq_hashes": seq_hashes(prompt, BLOCK), "block_size": BLOCK},
        True,
        1 << 20,
        1 << 16,
    )
    _, hits = conductor.query(query)
    assert len(hits) == args.instances
    assert hits[regs[-1].instance_id].longest == len(prompt) // BLOCK
    cold = parse_query(
        {"model": MODEL, "token_ids": [t + 1 for t in prompt], "block_size": BLOCK},
        False,
        1 << 20,
        1 << 16,
    )
    assert conductor.query(cold)[1] == {}
    for name, q in (
        ("query (token ids, hashing included)", query),
        ("query_by_hash", hashed),
        ("query, a cold prompt (no instance holds its first block)", cold),
    ):
        samples, cpu, preempted = [], [], []
        for _ in range(args.queries):
            s0 = _switches()
            c0 = time.thread_time()
            t0 = time.perf_counter()
            conductor.query(q)
            samples.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            preempted.append(_switches() > s0)
        rows.append(_latency_row(name, samples, cpu, preempted, f"{args.queries} queries"))
    for separate in (False, True):
        e2e, handled = asyncio.run(http_latency(conductor, body, args.http_queries, separate))
        where = "client in another process" if separate else "client in the same process"
        p50, p99, worst = percentiles(e2e)
        rows.append(
            f"| HTTP POST /query, end to end, {where} | p50 {p50:.3f} ms | p99 {p99:.3f} ms "
            f"| max {worst:.3f} ms, {args.http_queries} requests |"
        )
        rows.append(
            _latency_row(
                f"HTTP POST /query, server handling, {where}",
                *handled,
                f"{args.http_queries} requests",
            )
        )

    report(args, load, rows)
    return 0


def report(args: argparse.Namespace, load: tuple[float, float, float], rows: list[str]) -> None:
    cpu = cpu_model(platform.processor() or platform.machine())
    end = os.getloadavg()
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs ({cpu}), Python "
        f"{platform.python_version()}, heimdall-proxy at {git_head() or '?'}; load average "
        f"{load[0]:.1f} at start, {end[0]:.1f} at the end."
    )
    without = (
        f" Without {' and '.join(args.without)} (in this process; ingest worker processes "
        "use what is built)."
        if args.without
        else ""
    )
    print(
        f"{args.instances} instances x {args.blocks:,} blocks of {BLOCK} tokens, query of "
        f"{args.prompt_tokens} tokens ({args.prompt_tokens // BLOCK} blocks).{without}\n"
    )
    print("| what | rate / p50 | blocks/s / p99 | detail |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    raise SystemExit(main())
