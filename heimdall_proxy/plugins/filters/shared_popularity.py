"""The affinity filter's prefix popularity counted over every gateway replica's requests.

PrefixPopularity counts, per shared prefix, the recent requests that used it, on a clock
that ticks once per request. A replica sees only its share of the traffic, so with two of
them each count covered half the requests and rose half as fast: while a hot system prompt
warmed up (the first two or three half-lives) a replica's count was well below what one
gateway would have counted, and it released the prefix at a larger margin than one gateway
would. Here every replica replays every other replica's requests into its own count: its
requests (the prefix each shared, or none) ride on the pushes its counters already send
(replicas/counters.py `Rider`), about one round trip after they were sent, with no round
trip or message of their own. The count then follows the fleet's requests, as one gateway's
does. Delivery is at most once, as a notification's: a push lost to a broken connection
loses its requests' share of the count, which decays away anyway.
"""

from __future__ import annotations

from typing import Any

from heimdall_proxy.plugins.filters.prefix_popularity import PrefixPopularity

__all__ = ["SharedPopularity"]

#: Requests kept for the next push (a replica whose hub is not ticking, e.g. never started,
#: must not grow without bound), and the most one push may carry.
MAX_PENDING = 4096
#: msgpack's integer range: a key outside it is counted locally only.
_LOW, _HIGH = -(2**63), 2**64


class SharedPopularity:
    """A PrefixPopularity fed with this replica's requests (`observe`) and, through the
    counters' pushes (outgoing / incoming: a Rider), the other replicas'."""

    __slots__ = ("_pending", "popularity")

    def __init__(self, popularity: PrefixPopularity) -> None:
        self.popularity = popularity
        self._pending: list[int | None] = []

    def observe(self, key: int | None) -> None:
        """This replica sent a request sharing the prefix `key` (None: none)."""
        self.popularity.observe(key)
        if len(self._pending) < MAX_PENDING and (key is None or _LOW <= key < _HIGH):
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
