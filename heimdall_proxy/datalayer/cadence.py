"""When each pod's /metrics is due: busy pods every interval, quiet pods less and less often.

Scraping every pod every 100 ms costs CPU in proportion to the fleet even when nothing
happens. Most of those scrapes tell the gateway what it already knows: a pod whose last
scrape showed an empty queue, which the gateway has sent nothing since, is still empty,
unless clients other than this gateway use it. So a pod is *quiet* when its last scrape
showed nothing waiting or running, nothing this gateway sent is in flight on it, and the
gateway has sent it nothing since that scrape (the in-flight ledger's `sent` counter tells).
A quiet pod's interval doubles on every scrape up to `idle_interval`; the first request the
gateway sends it makes it busy again, and it is scraped on the next tick.

While quiet, the pod's numbers are vouched for by the ledger: its snapshot's `updated_at`
moves forward, without a scrape, once it is an interval old, so staleness checks (the
saturation detector's metricsStalenessThreshold) see a fresh, empty pod, which it is as far
as this gateway can know, no older than a busy pod's (an interval plus a tick). Not on
every tick: a new snapshot per quiet pod per tick was most of an idle gateway's scraping
CPU at 256 pods. Changes made by other clients show within `idle_interval`."""

from __future__ import annotations

from dataclasses import dataclass

from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import Endpoint, Metrics


def _vouched(m: Metrics, now: float) -> Metrics:
    """`m` taken again at `now` (dataclasses.replace, without its per-call introspection)."""
    return Metrics(
        m.waiting, m.running, m.kv_cache_usage, m.lora_running, m.lora_waiting, m.max_lora,
        m.block_size, m.num_gpu_blocks, now,
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
    """Decides, on each tick, which pods to scrape; records each scrape's outcome."""

    def __init__(self, load: InFlightLoad, interval: float, idle_interval: float) -> None:
        self.load = load
        self.interval = interval
        self.idle_interval = max(interval, idle_interval)
        self._pods: dict[str, PodCadence] = {}

    def pod(self, name: str) -> PodCadence:
        state = self._pods.get(name)
        if state is None:
            state = self._pods[name] = PodCadence(self.interval)
        return state

    def forget(self, name: str) -> None:
        """A pod left the pool: drop its state (a pod that joins again starts afresh)."""
        self._pods.pop(name, None)

    def due(self, endpoints: list[Endpoint], now: float) -> list[Endpoint]:
        """The pods to scrape now. A quiet pod the gateway has just sent work to is due at
        once; a quiet pod left alone has its snapshot's age reset once it is an interval old
        (see the module doc). Runs every tick over every pod: kept to dict reads."""
        out: list[Endpoint] = []
        pods = self._pods
        sent = self.load.sent
        requests = self.load.requests
        interval = self.interval
        for ep in endpoints:
            name = ep.name
            state = pods.get(name) or self.pod(name)
            if state.scraping:
                continue
            if state.quiet:
                if sent.get(name, 0) != state.sent_at_scrape or requests.get(name, 0) > 0:
                    state.quiet = False
                    state.interval = interval
                    state.due = now
                elif now < state.due:
                    m = ep.metrics
                    if m.updated_at and now >= m.updated_at + interval:
                        ep.metrics = _vouched(m, now)
                    continue
            if now >= state.due:
                out.append(ep)
        return out

    def started(self, name: str, now: float) -> None:
        state = self.pod(name)
        state.scraping = True
        state.started_at = now
        state.sent_at_scrape = self.load.sent.get(name, 0)

    def finished(self, ep: Endpoint, ok: bool, now: float) -> None:
        """Schedule the next scrape from this one's outcome: a failed scrape or a busy pod
        keeps the base interval; a quiet pod backs off."""
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
        state.interval = min(self.idle_interval, state.interval * 2) if quiet else self.interval
        state.quiet = quiet
        # Start to start, so a busy pod's period is the interval, not interval + scrape time.
        state.due = state.started_at + state.interval
