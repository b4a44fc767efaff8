"""How long a new request would wait for a sequence slot on a pod, from the work the gateway
has in flight there.

Total outstanding work ranks pods well while they all have free slots. Once a pod runs as
many sequences as it can (vLLM's max_num_seqs, or fewer when its KV cache is full), a new
request waits for the first sequence to finish, and the total no longer says how long that
is: a pod whose two slots hold replies 10 and 100 tokens from done takes a new request
after 10 steps, one whose two replies are both 60 from done after 60, though the second
holds less work. This is the information a dispatcher that knows every request's length
uses to cut the queueing tail, and the gateway has it: each request's output limit, counted
down as its tokens stream back.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable


def start_delay(work_in_order: Iterable[float], slots: int) -> float:
    """Work (decode-token units) a pod running `slots` sequences at a time, first come first
    served, must finish before a new request gets a slot. `work_in_order` is the work left of
    the requests in flight there, oldest first: the oldest `slots` are running, each of the
    others starts when a slot frees and holds it for its whole work."""
    if slots <= 0:
        return 0.0
    it = iter(work_in_order)
    running: list[float] = []
    for work in it:
        running.append(work)
        if len(running) == slots:
            break
    else:
        return 0.0  # a slot is free
    heapq.heapify(running)
    for work in it:
        heapq.heapreplace(running, running[0] + work)
    return running[0]


class SlotCapacity:
    """Sequences each pod runs at once, learned from its scraped metrics (read when a request
    is sent there): the most requests seen running, trusted only once the pod has been seen
    with requests waiting (before that the pod was never full, and its capacity is unknown
    rather than small). A pod's capacity never shrinks here: a transient queue seen while
    the pod admits a burst only marks it as able to fill, and the running count keeps
    rising towards the true capacity as it does."""

    __slots__ = ("_max_running", "_saturated")

    def __init__(self) -> None:
        self._max_running: dict[str, int] = {}
        self._saturated: set[str] = set()

    def observe(self, pod: str, running: int, waiting: int) -> None:
        if running > self._max_running.get(pod, 0):
            self._max_running[pod] = running
        if waiting > 0 and running > 0:
            self._saturated.add(pod)

    def slots(self, pod: str) -> int | None:
        """The pod's capacity, or None while it has never been seen full."""
        if pod not in self._saturated:
            return None
        return self._max_running.get(pod)

    def learned(self) -> list[tuple[str, int]]:
        """(pod, capacity) of every pod seen full."""
        return [(pod, self._max_running[pod]) for pod in self._saturated]

    def forget(self, pod: str) -> None:
        self._max_running.pop(pod, None)
        self._saturated.discard(pod)
