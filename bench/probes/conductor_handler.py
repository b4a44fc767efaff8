"""The conductor's server-side CPU per /query (an 8k-token query against 64 instances that
hold a staggered share of it, as bench/conductor.py sets up), without HTTP: the handler is
called directly, so JSON parsing, checks, hashing, the index and the answer are what is
timed (process CPU time, which other jobs on the machine disturb less than wall time).

Run from the checkout's root: python -m bench.probes.conductor_handler. To time another
tree's handler in the same shell, put its package first and keep the working directory off
the path: `PYTHONPATH=DIR:. python -P -m bench.probes.conductor_handler`, DIR holding that
tree's heimdall_proxy (`git archive main heimdall_proxy | tar -x -C DIR`). The line printed
names the tree that ran.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import orjson

import heimdall_proxy
from bench.conductor import BLOCK, MODEL, registrations, stagger
from heimdall_proxy.conductor import app as conductor_app
from heimdall_proxy.conductor.service import Conductor


async def measure() -> list[float]:
    conductor = Conductor()
    regs = registrations(conductor, 64)
    prompt = [random.Random(3).randrange(128_000) for _ in range(8192)]
    await asyncio.to_thread(stagger, conductor, regs, prompt)
    body = orjson.dumps({"model": MODEL, "token_ids": prompt, "block_size": BLOCK})
    app = conductor_app.create_app()
    app[conductor_app.CONDUCTOR] = conductor
    handler = conductor_app._query(False)

    class Request:  # what the handler reads of an aiohttp request
        def __init__(self) -> None:
            self.app = app

        async def read(self) -> bytes:
            return body

    request: Any = Request()
    for _ in range(100):
        await handler(request)
    rounds = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(300):
            await handler(request)
        rounds.append((time.process_time() - t0) / 300 * 1e3)
    return rounds


def main() -> int:
    assert heimdall_proxy.__file__
    root = Path(heimdall_proxy.__file__).resolve().parents[1]
    rounds = asyncio.run(measure())
    print(f"{root}: CPU ms per /query handler call, 5 rounds of 300: "
          f"{' '.join(f'{r:.3f}' for r in rounds)}; min {min(rounds):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
