"""The cyclic garbage collector, set for a server that lives long and allocates per request.

Two settings, applied once the app is up:

- `gc.freeze()`: everything alive after start-up (modules, config, plugins, the pool) lives
  as long as the process; frozen, the collector never walks it again, so a collection only
  walks what requests allocated since.
- A young-generation threshold of `YOUNG_THRESHOLD` net container allocations instead of
  CPython's 700. Almost everything a request allocates is freed by reference counting when
  the request ends; a collection only walks the objects still alive at that moment, which
  under load are the requests in flight (32 concurrent requests hold well over 700
  containers, so at 700 the collector ran every few requests and walked them all again each
  time: 4.3% of the gateway's instructions per request at 16 connections, bench/RESULTS.md).
  Ten times fewer collections walk about the same live set each, so the collector's share
  falls about tenfold.

Memory bound: garbage in reference cycles waits for a young collection, so at most
`YOUNG_THRESHOLD` more container objects (each typically 50-500 bytes: a few MB at worst) are
held than with the default; the older generations keep CPython's ratios (10, 10), so a
full collection still follows at the same relative pace.
"""

from __future__ import annotations

import gc

#: Net container allocations between two young-generation collections (CPython: 700).
YOUNG_THRESHOLD = 7000


def settle() -> None:
    """Collect once, freeze what survived start-up, and raise the young threshold."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
