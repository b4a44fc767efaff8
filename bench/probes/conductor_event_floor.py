"""How far the conductor's per-event ingest is from the least CPython can do.

Decode-step traffic sends vLLM events of one block each, so the per-event work dominates.
This times, in one process and on the same payloads (batches of eight one-block events,
`bench.conductor.vllm_payloads`), the real path (`bench.conductor.ingest_vllm`: each batch
prepared as the event loop prepares it and applied: in C where native/_vllm_ingest.c is
built, else decoded, checked, normalised and applied in Python) against a floor that keeps
only what no Python implementation can skip: msgpack decode, the C block-key chain, one
engine-map insert and one index update per event, with no validation and no objects. Where
the real path is Python, the gap is what any trimming of it could win at most; the native
path goes below that floor (no Python per event at all).

Run: python -m bench.probes.conductor_event_floor [--instances 64] [--blocks 20000]
"""

from __future__ import annotations

import asyncio
import gc
import time

import msgpack

from bench.conductor import BLOCK, ingest_vllm, registrations, vllm_payloads
from bench.harness import cli
from heimdall_proxy.conductor.service import Conductor
from heimdall_proxy.kvcache.hashing import STANDARD_HASH_SEED, block_keys


def floor(payloads: list[tuple[str, bytes]], bits: dict[str, int]) -> tuple[float, int]:
    """CPU seconds and blocks for the least work per event (see the module docstring)."""
    engine: dict[str, dict[int, int]] = {}
    index: dict[int, int] = {}
    unpack = msgpack.unpackb
    gc.collect()
    t0 = time.process_time()
    n = 0
    for key, payload in payloads:
        emap = engine.get(key)
        if emap is None:
            emap = engine[key] = {}
        bit = bits[key]
        get = index.get
        for ev in unpack(payload)[1]:
            parent = ev[2]
            tokens = ev[3]
            keys = block_keys(
                tokens, BLOCK, STANDARD_HASH_SEED, None if parent is None else emap.get(parent)
            )
            emap.update(zip(ev[1], keys, strict=False))
            for k in keys:
                m = get(k)
                index[k] = bit if m is None else m | bit
            n += len(keys)
    return time.process_time() - t0, n


def main() -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=20_000, help="blocks per instance")
    args = ap.parse_args()
    conductor = Conductor()
    regs = registrations(conductor, args.instances)
    payloads = vllm_payloads(regs, args.blocks, per_event=1, per_batch=8)
    bits = {reg.key: 1 << i for i, reg in enumerate(regs)}
    cpu, n = floor(payloads, bits)
    gc.collect()
    c0 = time.process_time()
    asyncio.run(ingest_vllm(conductor, payloads))
    real = time.process_time() - c0
    assert conductor.stats.stored_blocks == n, (conductor.stats.stored_blocks, n)
    # then every block evicted, as decode steps on a full cache remove about as many
    removals = [
        (key, msgpack.packb([time.time(), [["BlockRemoved", ev[1], "GPU"] for ev in evs], 0]))
        for key, evs in ((k, msgpack.unpackb(p)[1]) for k, p in payloads)
    ]
    gc.collect()
    c0 = time.process_time()
    asyncio.run(ingest_vllm(conductor, removals))
    removed = time.process_time() - c0
    assert conductor.stats.removed_blocks == n, (conductor.stats.removed_blocks, n)
    print(
        f"{args.instances} x {args.blocks:,} blocks in one-block events, 8 per batch: "
        f"CPU per block: floor {cpu / n * 1e6:.2f} us, conductor {real / n * 1e6:.2f} us "
        f"({real / cpu:.2f}x); removing them again: {removed / n * 1e6:.2f} us"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
