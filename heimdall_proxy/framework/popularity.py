"""How many recent requests shared each prefix: learned from the prefix matches of the
requests sent, kept here once per gateway and read by any plugin (`PluginHandle.popularity`).

The affinity filter holds a request on the pods that have its prefix until the best of them
would answer more than a margin later than the best other pod. The margin pays for the cache
a move gives up, and what that is worth depends on the prefix. A conversation's history is
wanted by one request at a time: moving it buys this request a shorter wait and the next turn
follows it to the new pod, so holding it costs little and keeps its hits. A system prompt
that many requests share is wanted by all of them: a pod it moves to is warm for every later
one, and holding it on busy pods queues all of them. So the filter divides the margin by a
power of how many recent requests shared the prefix (see plugins/prefix_affinity/filter.py);
this module keeps that count, decayed per request seen.

Who owns it: the prefix data's owner. Today that is this module's `Popularities`, one per
gateway process (the routing hands the same one to the plugins of the config that replaces
it, so a reload carries the counts over); a request is counted once when it is sent, under
the prefix the reader that priced it left on the request's CycleState (`observe`, deduplicated
per attempt, so several readers do not count it twice). Prefix keys name no pod: there is
nothing to forget when pods leave, and counts expire by decaying.

Replica sharing: a replica sees only its share of the traffic, so with two of them each count
covered half the requests and rose half as fast: while a hot system prompt warmed up (the
first two or three half-lives) a replica's count was well below what one gateway would have
counted, and it released the prefix at a larger margin than one gateway would. A
`SharedPopularity` therefore replays every other replica's requests into its own count: its
requests (the prefix each shared, or none) ride on the pushes a set of replica counters
already sends (replicas/counters.py `Rider`), about one round trip after they were sent, with
no round trip or message of their own. Delivery is at most once, as a notification's: a push
lost to a broken connection loses its requests' share of the count, which decays away anyway.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAX_PENDING", "Popularities", "PrefixPopularity", "SharedPopularity"]

#: Requests kept for the next push (a replica whose hub is not ticking, e.g. never started,
#: must not grow without bound), and the most one push may carry.
MAX_PENDING = 4096
#: msgpack's integer range: a key outside it is counted locally only.
_LOW, _HIGH = -(2**63), 2**64


class PrefixPopularity:
    """Exponentially decayed request counts per prefix key, on a clock that ticks once per
    request seen: after n requests, a count has been multiplied by 0.5 ** (n / half_life).
    Keys whose count has decayed below `floor` are dropped every `half_life` requests, so
    memory is bounded by the keys of recent traffic."""

    __slots__ = ("_counts", "_floor", "_keep", "_seen", "_sweep_every")

    def __init__(self, half_life: float = 64.0, floor: float = 0.01) -> None:
        self._keep = math.pow(0.5, 1.0 / half_life)
        self._floor = floor
        self._sweep_every = max(1, int(half_life))
        # key -> (count as of request number `at`, at)
        self._counts: dict[int, tuple[float, int]] = {}
        self._seen = 0

    def __len__(self) -> int:
        return len(self._counts)

    def observe(self, key: int | None) -> float:
        """Count one request (sharing the prefix `key`, or none) and return the decayed
        number of recent requests that shared `key`, this one included (0.0 for None)."""
        self._seen += 1
        if self._seen % self._sweep_every == 0:
            self._sweep()
        if key is None:
            return 0.0
        count = self.count(key) + 1.0
        self._counts[key] = (count, self._seen)
        return count

    def count(self, key: int) -> float:
        """The decayed number of recent requests that shared `key`."""
        entry = self._counts.get(key)
        if entry is None:
            return 0.0
        count, at = entry
        return count * math.pow(self._keep, self._seen - at)

    def _sweep(self) -> None:
        floor = self._floor
        self._counts = {
            k: (c, at)
            for k, (c, at) in self._counts.items()
            if c * math.pow(self._keep, self._seen - at) >= floor
        }


class SharedPopularity:
    """A PrefixPopularity fed with this replica's requests (`observe`) and, through a set of
    replica counters' pushes (outgoing / incoming: a Rider), the other replicas'. Until
    `riding` is set (something carries the pushes), nothing is kept for them."""

    __slots__ = ("_last", "_pending", "popularity", "riding")

    def __init__(self, popularity: PrefixPopularity, riding: bool = True) -> None:
        self.popularity = popularity
        self.riding = riding
        self._pending: list[int | None] = []
        #: the attempt counted last (a second reader's observe of it counts nothing)
        self._last: str | None = None

    def __len__(self) -> int:
        return len(self.popularity)

    def count(self, key: int) -> float:
        """The decayed number of recent requests (every replica's, when shared) that shared
        `key`."""
        return self.popularity.count(key)

    def observe(self, key: int | None, attempt: str | None = None) -> None:
        """This replica sent a request sharing the prefix `key` (None: none); `attempt` (its
        key) makes a second call for the same attempt count nothing."""
        if attempt is not None:
            if attempt == self._last:
                return
            self._last = attempt
        self.popularity.observe(key)
        if (
            self.riding
            and len(self._pending) < MAX_PENDING
            and (key is None or _LOW <= key < _HIGH)
        ):
            self._pending.append(key)

    def outgoing(self) -> list[int | None] | None:
        """The requests observed since the last push (now taken), or None."""
        if not self._pending:
            return None
        out, self._pending = self._pending, []
        return out

    def incoming(self, payload: Any) -> None:
        """Another replica's requests (`outgoing`'s list): counted as if seen here. Checked
        whole before any is counted."""
        if not isinstance(payload, list):
            raise TypeError(f"expected a list of prefix keys, got {type(payload).__name__}")
        if len(payload) > MAX_PENDING:
            raise ValueError(f"{len(payload)} requests in one push (at most {MAX_PENDING})")
        for key in payload:
            if key is not None and (not isinstance(key, int) or isinstance(key, bool)):
                raise TypeError(f"not a prefix key: {key!r}")
        observe = self.popularity.observe
        for key in payload:
            observe(key)


class Popularities:
    """The gateway's prefix popularities, one per half-life (the counts' meaning depends on
    it): `of(half_life)` is the same object for every reader that asks, across reloads."""

    __slots__ = ("_by_half_life",)

    def __init__(self) -> None:
        self._by_half_life: dict[float, SharedPopularity] = {}

    def of(self, half_life: float) -> SharedPopularity:
        """The popularity counted with `half_life` (requests), made on first use."""
        found = self._by_half_life.get(half_life)
        if found is None:
            found = self._by_half_life[half_life] = SharedPopularity(
                PrefixPopularity(half_life), riding=False
            )
        return found

    def all(self) -> list[SharedPopularity]:
        return list(self._by_half_life.values())
