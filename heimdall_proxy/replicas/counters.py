"""Per-pod totals (requests or work in flight) summed over every live gateway replica.

Each replica publishes its own totals as a whole, never as deltas: a hash per replica
(`<prefix>r:<id>`, pod -> value) rewritten every tick with a time to live, and its id in a
sorted set (`<prefix>replicas`) scored by the server's clock. One script per tick writes the
hash and returns the other live replicas' hashes, so a tick is one round trip whatever the
number of replicas or pods. A replica that dies stops refreshing its hash: its counts vanish
after `ttl` (no delta is left behind to undo), and a restarted one starts from zero. Requests
read the last pulled totals from memory: no I/O on the request path, at the price of up to
one tick (plus the other replica's tick) of staleness."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from importlib import resources

import redis.asyncio as aioredis

from heimdall_proxy.replicas.ticker import Ticker

SCRIPT = (resources.files(__package__) / "lua" / "counters.lua").read_text(encoding="utf-8")


class ReplicaCounters:
    """The other replicas' per-pod totals, kept fresh by a background tick that also
    publishes `local()` (this replica's per-pod totals). Owns `redis`: stop() closes it."""

    __slots__ = (
        "_local",
        "_others",
        "_prefix",
        "_pulled",
        "_redis",
        "_script",
        "_ticker",
        "_ttl",
        "_ttl_ms",
        "replica",
    )  # fmt: skip

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        local: Callable[[], Mapping[str, float]],
        interval: float,
        ttl: float,
        replica: str | None = None,
    ) -> None:
        self.replica = replica or uuid.uuid4().hex[:16]
        self._redis = redis
        self._prefix = prefix
        self._local = local
        self._ttl = ttl
        self._ttl_ms = max(1, int(ttl * 1000))
        self._script = redis.register_script(SCRIPT)
        self._ticker = Ticker(f"counters {prefix}", interval, self.sync)
        self._others: dict[str, float] = {}
        self._pulled = 0.0

    def others(self) -> Mapping[str, float]:
        """pod -> sum over the other live replicas, as of the last tick; empty when the last
        successful tick is older than the time to live (Redis unreachable: the others' counts
        would only grow staler, so this replica routes on its own)."""
        if time.monotonic() - self._pulled > self._ttl:
            return {}
        return self._others

    async def sync(self) -> None:
        """Publish this replica's totals and pull the others' (one round trip)."""
        args: list[str | int] = [self._prefix + "r:", self.replica, self._ttl_ms]
        for pod, value in self._local().items():
            if value:
                args += (pod, repr(float(value)))
        flat = await self._script(keys=[self._prefix + "replicas"], args=args)
        others: dict[str, float] = {}
        for i in range(0, len(flat) - 1, 2):
            pod = flat[i].decode()
            others[pod] = others.get(pod, 0.0) + float(flat[i + 1])
        self._others = others
        self._pulled = time.monotonic()

    def changed(self) -> None:
        """This replica's totals changed: publish them at the next opportunity (MIN_GAP)."""
        self._ticker.poke()

    @property
    def reachable(self) -> bool:
        return self._ticker.reachable

    async def start(self) -> None:
        await self._ticker.once()
        self._ticker.start()

    async def stop(self) -> None:
        """Stop publishing and withdraw this replica's counts at once (a clean shutdown need
        not wait for them to expire)."""
        await self._ticker.stop()
        try:
            await self._redis.delete(self._prefix + "r:" + self.replica)
            await self._redis.zrem(self._prefix + "replicas", self.replica)
        except Exception:  # best effort: they expire anyway
            pass
        finally:
            await self._redis.aclose()
