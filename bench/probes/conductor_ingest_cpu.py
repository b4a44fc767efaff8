"""CPU per vLLM block of the conductor's ingest, stage by stage, in one process: what the
event loop spends sending a worker its jobs (pickling them), what the worker spends
(unpickling, decoding, hashing, the engine-hash maps, pickling its answer), what the loop
spends applying the answer (unpickling, the index), and the inline path (decode + apply on
the loop, `ingestWorkers: 0`). The bench's vLLM batches (bench/conductor.py: one
BlockStored of 32 blocks of 16 tokens per batch, round-robin over the instances), jobs of
128 batches (what the subscriber hands the preparer at a time under load).

Process CPU time, which other jobs on the machine disturb less than wall time (they still
share the caches: compare checkouts alternated in one shell). The subscriber's queues and
the executor's threads and pipes are not in it: bench/conductor.py's pipeline rows have the
whole path.

Run from the checkout's root: python -m bench.probes.conductor_ingest_cpu [--blocks N]
[--rounds R]. To measure another tree's conductor (it must have conductor.prepare's worker
entry point, of either signature), put its package first and keep the working directory off
the path: `PYTHONPATH=DIR:. python -P -m bench.probes.conductor_ingest_cpu`, DIR holding that
tree's heimdall_proxy (`git archive main heimdall_proxy | tar -x -C DIR`). The first line
printed names the tree that ran.
"""

from __future__ import annotations

import gc
import inspect
import pickle
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import cli

JOB = 128


def _run(coro: Any) -> None:
    """Run a coroutine that never suspends (Conductor.apply on a resolved batch)."""
    try:
        coro.send(None)
    except StopIteration:
        return
    raise RuntimeError("apply suspended")


def measure(instances: int, blocks: int) -> dict[str, float]:
    """us of CPU per block of each stage, for the tree heimdall_proxy was imported from."""
    from bench.conductor import registrations, vllm_payloads
    from heimdall_proxy.conductor import prepare as prep
    from heimdall_proxy.conductor.service import Conductor
    from heimdall_proxy.kvcache.events import decode_batch

    source = Conductor()
    regs = {r.key: r for r in registrations(source, instances)}
    payloads = vllm_payloads(list(regs.values()), blocks)
    jobs = [payloads[i : i + JOB] for i in range(0, len(payloads), JOB)]
    lists = "pods" in inspect.signature(prep.prepare_in_worker).parameters
    if lists:
        from heimdall_proxy.conductor.wire import registration_fields

        def args(job: list[tuple[str, bytes]]) -> tuple[Any, ...]:
            return (
                [k for k, _ in job], [0] * len(job), [p for _, p in job],
                {k: registration_fields(regs[k]) for k, _ in job}, 1337, source.index.max_keys,
            )  # fmt: skip
    else:

        def args(job: list[tuple[str, bytes]]) -> tuple[Any, ...]:
            return (
                [(k, 0, p) for k, p in job], {k: regs[k] for k, _ in job}, 1337,
                source.index.max_keys,
            )  # fmt: skip

    n = len(payloads) * 32
    out: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        gc.collect()
        t0 = time.process_time()
        result = fn()
        out[name] = (time.process_time() - t0) / n * 1e6
        return result

    sent = timed("loop: pickle the jobs", lambda: [pickle.dumps(args(j), -1) for j in jobs])

    def worker() -> list[bytes]:
        return [pickle.dumps(prep.prepare_in_worker(*pickle.loads(s)), -1) for s in sent]

    answers = timed("worker: unpickle, prepare, pickle", worker)
    sent.clear()
    target = Conductor()
    registrations(target, instances)

    def apply() -> None:
        for job, answer in zip(jobs, answers, strict=True):
            for (key, payload), one in zip(job, pickle.loads(answer), strict=True):
                _run(target.apply(key, prep._unpacked(one, 0, payload)))

    timed("loop: unpickle, apply", apply)
    assert target.stats.stored_blocks == n, target.stats.stored_blocks
    answers.clear()
    target.index.spaces.clear()
    inline = Conductor()
    registrations(inline, instances)

    def decode_apply() -> None:
        for key, payload in payloads:
            _run(inline.apply(key, decode_batch(payload)))

    timed("inline: decode, apply", decode_apply)
    assert inline.stats.stored_blocks == n
    return out


def main() -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=20_000, help="blocks per instance")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    import heimdall_proxy

    assert heimdall_proxy.__file__
    root = Path(heimdall_proxy.__file__).resolve().parents[1]
    rounds = [measure(args.instances, args.blocks) for _ in range(args.rounds)]
    print(f"{root}: us of CPU per block, {args.instances} x {args.blocks:,} blocks, "
          f"{args.rounds} round(s) (median; each round)")  # fmt: skip
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        each = " ".join(f"{v:.3f}" for v in values)
        print(f"  {name:36s} {statistics.median(values):.3f}  ({each})")
    worker_side = [r["worker: unpickle, prepare, pickle"] for r in rounds]
    loop_side = [r["loop: pickle the jobs"] + r["loop: unpickle, apply"] for r in rounds]
    total = [w + lo for w, lo in zip(worker_side, loop_side, strict=True)]
    print(f"  {'with a worker: loop + worker':36s} {statistics.median(loop_side):.3f} + "
          f"{statistics.median(worker_side):.3f} = {statistics.median(total):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
