"""When a request sent to a pod now would finish, from what the gateway has in flight there:
the arithmetic finish-time-scorer reads the in-flight ledger with.

A pod that runs a fixed number of requests at once (vLLM's `max_num_seqs`, or its KV cache
when full) starts a new request when a slot frees, and the slot that frees first depends on
how much each running request has left, which the gateway knows: the prompt it has not yet
seen answered and the output tokens it asked for less those streamed. A count of work (tokens
in flight) cannot tell a full pod whose requests end in a moment from one whose requests just
began, nor a pod that decodes at half speed from a fast one; seconds can. Two LoRA rules as
vLLM applies them: a request whose adapter is not resident waits, when every adapter slot
holds another adapter in use, until the running requests of those adapters end (the requests
behind it go first, so it is not helped by its place in the queue); and it can start as soon
as a slot frees otherwise.

The replay is the one the queue price uses on a pod seen to queue (service_time.py), with
each request's own remaining seconds in place of the pod's mean service time: mixed traffic
puts 10-token and 1,000-token answers side by side, and the mean says little about either."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["Ahead", "finish_time", "start_time"]


class Ahead(NamedTuple):
    """A request in flight on the pod, oldest first: seconds of work left (prefill still to
    answer, then its output tokens still to stream, at the pod's pace) and the LoRA adapter
    it names ("" for the base model)."""

    left: float
    model: str


def start_time(
    ahead: Sequence[Ahead], slots: int | None, adapter: str = "", max_adapters: int = 0
) -> float:
    """Seconds until a request sent now would start on a pod running `slots` requests at
    once (None: as many as are sent, so no wait), behind `ahead`. A request for LoRA
    `adapter` on a pod with `max_adapters` adapter slots (0: unknown, not looked at) also
    waits for the running requests of other adapters when they fill every adapter slot."""
    running = ahead if slots is None else ahead[:slots]
    start = 0.0
    if slots is not None and len(ahead) >= slots:
        free = [a.left for a in running]
        heapq.heapify(free)
        for queued in ahead[slots:]:
            heapq.heapreplace(free, free[0] + queued.left)
        start = free[0]
    if adapter and max_adapters > 0:
        start = max(start, _adapter_wait(running, adapter, max_adapters))
    return start


def _adapter_wait(running: Sequence[Ahead], adapter: str, max_adapters: int) -> float:
    """Seconds until an adapter slot is free for `adapter`: none while it is resident (a
    running request names it) or an adapter slot is free; else until enough of the other adapters'
    running requests have ended (vLLM evicts an adapter no running request uses)."""
    ends: dict[str, float] = {}  # adapter -> when its last running request ends
    for a in running:
        if a.model == adapter:
            return 0.0
        if a.model:
            ends[a.model] = max(ends.get(a.model, 0.0), a.left)
    if len(ends) < max_adapters:
        return 0.0
    return sorted(ends.values())[len(ends) - max_adapters]


def finish_time(
    ahead: Sequence[Ahead], own: float, slots: int | None, adapter: str = "", max_adapters: int = 0
) -> float:
    """Seconds until a request of `own` seconds of work sent now would finish: start_time's
    wait, then its own work."""
    return start_time(ahead, slots, adapter, max_adapters) + own
