"""When each pod's /metrics is due: busy pods every interval, quiet pods less and less often.

Scraping every pod every 100 ms costs CPU in proportion to the fleet even when nothing
happens. Most of those scrapes tell the gateway what it already knows: a pod whose last
scrape showed an empty queue, which the gateway has sent nothing since, is still empty,
unless clients other than this gateway use it. So a pod is *quiet* when its last scrape
showed nothing waiting or running, nothing this gateway sent is in flight on it, and the
gateway has sent it nothing since that scrape (the in-flight ledger's `sent` counter tells).
A quiet pod's interval doubles on every scrape up to `idle_interval`; the first request the
gateway sends it makes it busy again and due at once: the ledger tells the refresher of
every send (`InFlightLoad.on_send`), which calls `wake` and starts the scrape.

While quiet, the pod's numbers are vouched for by the ledger: its snapshot is *held*
(`Metrics.held`, age 0), so staleness checks (the saturation detector's
metricsStalenessThreshold) see a fresh, empty pod, which it is as far as this gateway can
know. A hold lasts until the snapshot is replaced, and `wake` replaces it (stamped at the
send, not held) before the request that woke the pod is on its way; a scrape of a pod that
is not quiet leaves an unheld snapshot. So nothing has to tick to keep a quiet pod's age
down (the data layer once took a quiet pod's snapshot again every interval, which kept its
scrape loop awake 40 times a second for nothing). Changes made by other clients show within
`idle_interval`.

A fully backed-off pod's next scrape is put on a grid of `grid` seconds (rounded down, so
never later than the interval says): quiet pods are then scraped together, a few times a
second at most, and the refresher sleeps in between instead of waking for each pod."""

from __future__ import annotations

import math
from dataclasses import dataclass

from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import Endpoint, Metrics

#: How far before a grid point a time still counts as on it (`ScrapeCadence.on_grid`).
GRID_SLACK = 0.01


def _stamped(m: Metrics, at: float, held: bool) -> Metrics:
    """`m` dated `at`, held or not (dataclasses.replace, without its per-call
    introspection)."""
    return Metrics(
        m.waiting, m.running, m.kv_cache_usage, m.lora_running, m.lora_waiting, m.max_lora,
        m.block_size, m.num_gpu_blocks, at, held,
    )  # fmt: skip


@dataclass(slots=True)
class PodCadence:
    """One pod's scrape schedule."""

    interval: float
    due: float = 0.0
    #: The ledger's `sent` count for the pod, and the time, when its last scrape started.
    sent_at_scrape: int = -1
    started_at: float = 0.0
    #: The last scrape showed an empty pod and nothing sent was in flight.
    quiet: bool = False
    scraping: bool = False


class ScrapeCadence:
    """Decides, on each pass, which pods to scrape and when the next one is due; records
    each scrape's outcome; wakes a quiet pod the gateway sends work to."""

    def __init__(self, load: InFlightLoad, interval: float, idle_interval: float) -> None:
        self.load = load
        self.interval = interval
        self.idle_interval = max(interval, idle_interval)
        #: The step a backed-off pod's next scrape is rounded down to (module doc): a
        #: quarter of the idle interval, at least the busy interval.
        self.grid = max(interval, self.idle_interval / 4)
        #: The earliest due time of the pods not being scraped, as of the last `due` pass.
        self.next_due = math.inf
        self._pods: dict[str, PodCadence] = {}

    def pod(self, name: str) -> PodCadence:
        state = self._pods.get(name)
        if state is None:
            state = self._pods[name] = PodCadence(self.interval)
        return state

    def forget(self, name: str) -> None:
        """A pod left the pool: drop its state (a pod that joins again starts afresh)."""
        self._pods.pop(name, None)

    def on_grid(self, when: float, interval: float) -> float:
        """`when`, rounded down to the grid when `interval` (the time since the last run) is
        at least two grid steps long (so the run stays at least a step after the last).
        Within GRID_SLACK before a grid point counts as on it: a run that started a hair
        early (its timer fired early, or its pass took what was due within TIMER_EARLY) is
        due again a whole interval on, not a grid step sooner every time."""
        if interval < 2 * self.grid:
            return when
        return math.floor((when + GRID_SLACK) / self.grid) * self.grid

    def is_quiet(self, name: str) -> bool:
        state = self._pods.get(name)
        return state is not None and state.quiet

    def wake(self, ep: Endpoint, now: float) -> None:
        """Work was sent to `ep` (quiet until now): due at once, on the busy interval, and its
        held snapshot no longer held (stamped `now`: it held until the send)."""
        state = self.pod(ep.name)
        state.quiet = False
        state.interval = self.interval
        state.due = now
        m = ep.metrics
        if m.held:
            ep.metrics = _stamped(m, now, False)

    def due(self, endpoints: list[Endpoint], now: float) -> list[Endpoint]:
        """The pods to scrape now; sets `next_due`. A quiet pod the gateway (or, shared,
        another replica) has sent work to since its scrape and that was not woken yet is
        woken here. Runs on every pass over every pod: kept to dict reads."""
        out: list[Endpoint] = []
        pods = self._pods
        sent = self.load.sent
        requests = self.load.requests
        soonest = math.inf
        for ep in endpoints:
            name = ep.name
            state = pods.get(name) or self.pod(name)
            if state.scraping:
                continue
            if state.quiet and (
                sent.get(name, 0) != state.sent_at_scrape or requests.get(name, 0) > 0
            ):
                self.wake(ep, now)
            if now >= state.due:
                out.append(ep)
            elif state.due < soonest:
                soonest = state.due
        self.next_due = soonest
        return out

    def started(self, name: str, now: float) -> None:
        state = self.pod(name)
        state.scraping = True
        state.started_at = now
        state.sent_at_scrape = self.load.sent.get(name, 0)

    def finished(self, ep: Endpoint, ok: bool, now: float) -> float:
        """Schedule the next scrape from this one's outcome, and return its time: a failed
        scrape or a busy pod keeps the base interval; a quiet pod backs off, its snapshot
        held."""
        state = self.pod(ep.name)
        state.scraping = False
        m = ep.metrics
        quiet = (
            ok
            and m.waiting == 0
            and m.running == 0
            and self.load.requests.get(ep.name, 0) == 0
            and self.load.sent.get(ep.name, 0) == state.sent_at_scrape
        )
        if quiet != m.held and m.updated_at:
            # Held from the scrape it was taken at; a hold that failed to renew lasted
            # until this scrape started (nothing had been sent then).
            ep.metrics = _stamped(m, m.updated_at if quiet else state.started_at, quiet)
        state.interval = min(self.idle_interval, state.interval * 2) if quiet else self.interval
        state.quiet = quiet
        # Start to start, so a busy pod's period is the interval, not interval + scrape time.
        state.due = self.on_grid(state.started_at + state.interval, state.interval)
        return state.due
