"""KV-block index benchmark: event ingest (blocks/s) and lookup latency of an 8k-token prompt
at 64 pods, for the in-memory and the Redis backends of precise-prefix-cache-scorer.

Ingest, three ways:

* events   - the gateway's path for a KV-event batch from the subscriber's queues on (its
             ZMQ receive left out): msgpack decode and the local block hashes (inline, or in
             `--decode-processes` worker processes), the rolling keys, index and engine-map
             updates (the plugin's apply_batch). Each event stores 32 blocks of 16 tokens,
             chained on the pod's previous event, round-robin over the pods.
* re-store - the same events again: the blocks' engine hashes are known, so the index
             does not chain (nor, inline, hash) them again; worker processes, which do not
             know, still hash (vLLM stores a block again after an eviction, or in another
             tier).
* keys     - the index data structure alone: precomputed keys added for a pod.

Lookup: a prompt of `--prompt-tokens` tokens (512 blocks of 16), candidates = all pods, in
three states: cold (nobody holds the first block), staggered (pod i holds the first
(i+1)/pods of the prompt; every pod is alive for part of the walk) and full (every pod holds
every block: the most work a lookup can do). `lookup` times the index lookup (keys given);
`keys+lookup` adds hashing the prompt. The index also holds the ingest benchmark's blocks.

Timings are best-of `--repeat` for throughput and percentiles over `--lookups` calls for
latency; the machine is usually shared, so the load average is printed with the results.

Run: python -m bench.prefix_index [--backend memory redis] [--redis-url URL] [--markdown]
                                  [--update-results bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from bench.harness import cli
from bench.harness.machine import cpu_model, git_head
from bench.harness.stats import distribution
from heimdall_proxy.kvcache.events import EventBatch
from heimdall_proxy.kvcache.hashing import LazyBlockKeys, block_keys, namespace_seed
from heimdall_proxy.kvcache.index import InMemoryIndex, KVBlockIndex, StoredBlocks
from heimdall_proxy.kvcache.index.redis import RedisIndex
from heimdall_proxy.kvcache.prepare import (
    EventPreparer,
    apply_batch,
    default_processes,
)
from heimdall_proxy.kvcache.subscriber import KVEventsSubscriber, SubscriberOptions

BLOCK = 16
BLOCKS_PER_EVENT = 32
MODEL = "bench-model"
NOTES = """Where the time goes (each part timed alone on the same machine, per block of 16 tokens).
Ingest starts with CPython work per token: msgpack-decoding the token ids (~0.31 µs) and
turning the batch into events (~0.09), then the local XXH3 hash of each block's u32 token
ids (~0.17, in C); with `decodeProcesses` these run in the worker process. The event loop
keeps the rest: the rolling chain (~0.09, one Python step per block, since a key needs its
parent's key, which only the index holds), the tier dict (~0.07) and the pod's engine-hash
map for later removals (~0.08), both bound by inserts into large dicts, and per-batch
overheads (the subscriber's queues, coroutines, unpacking the worker's reply). On two CPUs
the worker and the loop each fill one, so the worker mainly takes CPU off the loop that
serves requests. A block stored again keeps its keys (`re-store`: inline, no hashing at
all); "keys only" is the index structure alone. With Redis, a lookup is one round trip and
one Lua call: for a prompt whose 512 blocks are all held, the script MGETs 512 bitmaps and
returns them as one string (~150 µs inside Redis, from INFO commandstats), and the client
builds the key names and walks the bitmaps (~100 µs); the Redis server shares the two CPUs
with the benchmark. The Redis backend hashes the whole prompt before its one round trip (the
names go in the request), so its `keys + lookup` is the full hashing cost even for a cold
prompt; a cold prompt's script stops after 8 blocks. Writes are one script call per event,
one SETBIT per block, flushed once per burst of batches."""
BEGIN = "<!-- prefix-index:begin -->"
END = "<!-- prefix-index:end -->"


@dataclass
class Result:
    backend: str
    ingest: dict[str, float] = field(default_factory=dict)  # "phase/processes" -> blocks/s
    ingest_cpu: dict[str, float] = field(default_factory=dict)  # -> event-loop ns per block
    lookup: dict[str, dict[str, float]] = field(default_factory=dict)  # "state/kind" -> stats
    blocks: int = 0
    keys_in_index: int = 0


def make_events(pods: int, n_blocks: int, seed: int = 1) -> list[tuple[str, bytes]]:
    """(pod, msgpack batch) pairs in vLLM's map shape, blocks chained per pod; engine hashes
    are random unsigned 64-bit ints, as vLLM 0.32 sends them (sha256-derived)."""
    rng = random.Random(seed)
    last: dict[str, int | None] = {}
    out = []
    for i in range(n_blocks // BLOCKS_PER_EVENT):
        pod = f"pod-{i % pods}"
        hashes = [rng.getrandbits(64) for _ in range(BLOCKS_PER_EVENT)]
        tokens = [rng.randrange(128_000) for _ in range(BLOCKS_PER_EVENT * BLOCK)]
        event = {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": last.get(pod),
            "token_ids": tokens,
            "block_size": BLOCK,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        }
        last[pod] = hashes[-1]
        out.append((pod, msgpack.packb([time.time(), [event], 0])))
    return out


class _NoPods:
    """An empty pool: the benchmark feeds the subscriber itself."""

    def endpoints(self) -> list[Any]:
        return []

    def get(self, name: str) -> None:
        return None


async def ingest(
    index: KVBlockIndex, events: list[tuple[str, bytes]], preparer: EventPreparer
) -> tuple[float, float]:
    """The gateway's ingest path from the subscriber's queues on (its ZMQ receive left out):
    batches fed to a KVEventsSubscriber, prepared by `preparer` (in its worker processes, or
    inline), applied with the plugin's apply_batch, the index flushed as the subscriber does.
    Returns (wall seconds, this thread's CPU seconds) until the last batch is applied."""

    async def apply(pod: str, batch: EventBatch) -> None:
        await apply_batch(index, pod, batch, MODEL)

    sub = KVEventsSubscriber(
        SubscriberOptions(discover_pods=False), _NoPods(), apply, index.cleared,
        flush=index.flush, prepare=preparer.prepare,
    )  # fmt: skip
    await sub.start()
    try:
        t0, c0 = time.perf_counter(), time.thread_time()
        for pod, payload in events:
            await sub.feed(pod, payload)
        await sub.drain()
        await index.flush()
        return time.perf_counter() - t0, time.thread_time() - c0
    finally:
        await sub.stop()


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50, p99, max and mean of `samples_ns` in µs."""
    d = distribution(samples_ns, scale=1e-3)
    return {key: d[key] for key in ("p50", "p99", "max", "mean")}


async def bench(
    backend: str, pods: int, prompt_tokens: int, ingest_blocks: int, lookups: int, repeat: int,
    redis_url: str, decode_processes: int,
) -> Result:  # fmt: skip
    seed = namespace_seed(MODEL)
    result = Result(backend)
    prefix = f"hp-bench:{uuid.uuid4().hex[:10]}:"
    events = make_events(pods, ingest_blocks)
    result.blocks = len(events) * BLOCKS_PER_EVENT

    def fresh() -> KVBlockIndex:
        if backend == "memory":
            # podCacheSize = pods, so the "full" lookup really walks every pod
            return InMemoryIndex(BLOCK, pod_cache_size=pods)
        return RedisIndex(BLOCK, redis_url, key_prefix=prefix)

    # ---- ingest --------------------------------------------------------------------------
    index = fresh()
    for processes in sorted({0, decode_processes}):
        preparer = EventPreparer(BLOCK, MODEL, processes)
        preparer.start()
        await preparer.prepare([events[0][1]])  # the worker processes are up
        best = {"events": (float("inf"), 0.0), "re-store": (float("inf"), 0.0)}
        for _ in range(repeat):
            await index.close()
            await wipe(backend, redis_url, prefix)
            index = fresh()
            await index.start()
            for phase in ("events", "re-store"):  # re-store: the same events again
                took = await ingest(index, events, preparer)
                best[phase] = min(best[phase], took)
        await preparer.close()
        for phase, (wall, cpu) in best.items():
            result.ingest[f"{phase}/{processes}"] = result.blocks / wall
            result.ingest_cpu[f"{phase}/{processes}"] = cpu / result.blocks * 1e9
    if backend == "memory":
        rng = random.Random(5)
        key_sets = [[rng.getrandbits(64) for _ in range(BLOCKS_PER_EVENT)] for _ in events]
        best_keys = float("inf")
        for _ in range(repeat):
            idx = InMemoryIndex(BLOCK, pod_cache_size=pods)
            bits = [1 << idx._pod(f"pod-{i % pods}") for i in range(len(key_sets))]
            t0 = time.perf_counter()
            for bit, keys in zip(bits, key_sets, strict=True):
                idx._set(0, bit, keys)
            best_keys = min(best_keys, time.perf_counter() - t0)
        result.ingest["keys"] = result.blocks / best_keys

    # ---- lookups -------------------------------------------------------------------------
    rng = random.Random(9)
    prompt = [rng.randrange(128_000) for _ in range(prompt_tokens)]
    keys = block_keys(prompt, BLOCK, seed)
    n = len(keys)
    names = [f"pod-{p}" for p in range(pods)]
    cold_prompt = [rng.randrange(128_000) for _ in range(prompt_tokens)]
    cold_keys = block_keys(cold_prompt, BLOCK, seed)
    engine = 10**12

    async def hold(pod: str, count: int) -> None:
        nonlocal engine
        hashes = list(range(engine, engine + count))
        engine += count
        await index.block_stored(
            StoredBlocks(pod, "GPU", hashes, None, prompt[: count * BLOCK], BLOCK, seed)
        )
        await index.flush()

    for p, pod in enumerate(names):  # staggered: pod p holds (p+1)/pods of the prompt
        await hold(pod, max(1, (p + 1) * n // pods))

    async def measure(label: str, k: list[int], expect: dict[str, float] | None) -> None:
        got = await index.lookup(k, names)
        if expect is not None:
            assert got == expect, (label, got)
        for kind in ("lookup", "keys+lookup"):
            samples = []
            cpu = []
            for _ in range(lookups):
                c0 = time.thread_time_ns()
                t0 = time.perf_counter_ns()
                if kind == "keys+lookup":  # as the plugin does: keys hashed as the walk needs them
                    k2 = LazyBlockKeys(prompt if k is keys else cold_prompt, BLOCK, seed)
                    await index.lookup(k2, names)
                else:
                    await index.lookup(k, names)
                samples.append(time.perf_counter_ns() - t0)
                cpu.append(time.thread_time_ns() - c0)
            result.lookup[f"{label}/{kind}"] = percentiles(samples)
            result.lookup[f"{label}/{kind}/cpu"] = percentiles(cpu)

    staggered = {pod: float(max(1, (p + 1) * n // pods)) for p, pod in enumerate(names)}
    await measure("cold", cold_keys, {})
    await measure("staggered", keys, staggered)
    for pod in names:  # full: every pod holds every block
        await index.block_stored(
            StoredBlocks(pod, "GPU", list(range(engine, engine + n)), None, prompt, BLOCK, seed)
        )
        engine += n
    await index.flush()
    await measure("full", keys, dict.fromkeys(names, float(n)))
    if isinstance(index, InMemoryIndex):
        result.keys_in_index = len(index)
    await index.close()
    await wipe(backend, redis_url, prefix)
    return result


async def wipe(backend: str, redis_url: str, prefix: str) -> None:
    if backend != "redis":
        return
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_url)
    try:
        batch: list[Any] = []
        async for key in client.scan_iter(match=prefix + "*", count=5000):
            batch.append(key)
            if len(batch) >= 5000:
                await client.delete(*batch)
                batch = []
        if batch:
            await client.delete(*batch)
    finally:
        await client.aclose()


def machine() -> str:
    cpu = cpu_model(platform.processor() or platform.machine())
    commit = git_head() or "?"
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu}), {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, heimdall-proxy at {commit}"
    )


def markdown(results: list[Result], args: argparse.Namespace, load: tuple[float, float]) -> str:
    shown: list[str] = []
    skip = False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--update-results":
            skip = True  # and its value
        elif not arg.startswith("--update-results=") and arg != "--markdown":
            shown.append(arg)
    cmd = "python -m bench.prefix_index " + " ".join(shown)
    lines = [
        BEGIN,
        "## KV-block index (precise-prefix-cache-scorer)",
        "",
        f"Run {time.strftime('%Y-%m-%d')} with:",
        "",
        "```sh",
        cmd.strip(),
        "```",
        "",
        f"- Machine: {machine()}.",
        f"- 1-minute load average before the run {load[0]:.2f}, after {load[1]:.2f} "
        "(on a machine shared with other work: numbers are best-of / percentiles, not means).",
        f"- {args.pods} pods, blocks of {BLOCK} tokens; ingest: {results[0].blocks:,} blocks in "
        f"events of {BLOCKS_PER_EVENT} blocks; lookup: a {args.prompt_tokens}-token prompt "
        f"({args.prompt_tokens // BLOCK} blocks), {args.lookups} lookups per row.",
        "- Targets: ingest >= 1M blocks/s in memory; lookup p99 <= 1 ms.",
        "",
        f"Ingest, blocks/s (best of {args.repeat}), through the subscriber's queues, decoding and "
        "hashing inline or in worker processes (`kvEventsConfig.decodeProcesses`), applied "
        "as the plugin does; and the event loop's own CPU time per block (the worker "
        "processes' is not in it):",
        "",
        "| backend | decoding | events (decode + re-hash + index) | event-loop CPU, ns/block "
        "| re-store (known blocks) | keys only |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        keys = f"{r.ingest['keys']:,.0f}" if "keys" in r.ingest else "-"
        for mode in sorted({0, args.decode_processes}):
            where = "inline" if not mode else f"{mode} process{'es' if mode > 1 else ''}"
            ev, rs = r.ingest[f"events/{mode}"], r.ingest[f"re-store/{mode}"]
            cpu = r.ingest_cpu[f"events/{mode}"]
            lines.append(f"| {r.backend} | {where} | {ev:,.0f} | {cpu:,.0f} | {rs:,.0f} | {keys} |")
    lines += [
        "",
        "Lookup latency, µs, p50 / p99 / max: wall clock, and (for the in-memory backend, where",
        "all the work is this thread's) the thread's CPU time, which leaves out the time the",
        "process was not scheduled on the shared machine:",
        "",
        "| backend | prompt state | lookup | keys + lookup | lookup, CPU | keys + lookup, CPU |",
        "|---|---|---:|---:|---:|---:|",
    ]

    def cell(st: dict[str, float]) -> str:
        return f"{st['p50']:.0f} / {st['p99']:.0f} / {st['max']:.0f}"

    for r in results:
        for state in ("cold", "staggered", "full"):
            a = r.lookup[f"{state}/lookup"]
            b = r.lookup[f"{state}/keys+lookup"]
            if r.backend == "memory":
                cpu = f"{cell(r.lookup[f'{state}/lookup/cpu'])} | "
                cpu += cell(r.lookup[f"{state}/keys+lookup/cpu"])
            else:
                cpu = "- | -"
            lines.append(f"| {r.backend} | {state} | {cell(a)} | {cell(b)} | {cpu} |")
    lines += [
        "",
        "States: cold = no pod holds the first block; staggered = pod i holds the first "
        f"(i+1)/{args.pods} of the prompt; full = all {args.pods} pods hold all of it. "
        "`keys + lookup` includes hashing the prompt (XXH3-64 over its token ids, a chunk of 64 "
        "blocks at a time as the walk needs them, as the plugin does).",
        "",
        NOTES,
        END,
    ]
    return "\n".join(lines)


def update_results(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main() -> int:
    p = cli.parser(__doc__)
    p.add_argument("--backend", nargs="+", choices=("memory", "redis"), default=["memory", "redis"])
    cli.add_redis(p, "--redis-url")
    cli.add_pods(p, 64)
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--ingest-blocks", type=int, default=262_144)
    p.add_argument("--lookups", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--decode-processes", type=int, default=default_processes(),
        help="worker processes for the second ingest run (the first is inline); default: "
        "the plugin's default on this machine",
    )  # fmt: skip
    cli.add_output(p, json=False)
    p.add_argument("--update-results", metavar="FILE", help="write the section into FILE")
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    results = []
    for backend in args.backend:
        r = asyncio.run(
            bench(backend, args.pods, args.prompt_tokens, args.ingest_blocks, args.lookups,
                  args.repeat, args.redis_url, args.decode_processes)
        )  # fmt: skip
        results.append(r)
        print(f"{backend}: ingest")
        for k, v in r.ingest.items():
            cpu = r.ingest_cpu.get(k)
            print(
                f"  {k:22s} {v:12,.0f} blocks/s"
                + (f"  {cpu:5.0f} ns/block on the loop" if cpu else "")
            )
        for label, stats in r.lookup.items():
            if label.endswith("/cpu") and backend != "memory":
                continue
            p50, p99, top = stats["p50"], stats["p99"], stats["max"]
            print(f"  {label:22s} p50 {p50:7.0f} µs  p99 {p99:7.0f} µs  max {top:7.0f} µs")
    load1 = os.getloadavg()[0]
    section = markdown(results, args, (load0, load1))
    cli.write_markdown(args.markdown, section)
    if args.update_results:
        update_results(Path(args.update_results), section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
