"""How long the work in flight on a pod really delays the next request's first token, learned
from the first tokens this gateway sees.

The affinity filter weighs a pod's queue by the prompt tokens in flight there (the in-flight
ledger's `prompts`). Converting that to time at the pod's prefill rate is right only where the
wait is for prefill (a large batch that admits every request at once). Where requests wait for
a decode slot, each one ahead costs its whole reply, several times its prefill, and a filter
that prices the queue at prefill speed holds a busy warm pod far too long. Measuring the ratio
per pod (time to first token, less the request's own prefill, over the prompt tokens that were
ahead of it) gives the right price on either kind of pod, and on pods of unequal speed, with no
knob to calibrate.

A pod that runs several requests at once makes a request wait only for the work beyond what it
runs together: on a pod with two slots, one request ahead costs nothing and the second costs
about one reply. Pricing every token ahead alike averages those two, so a pod with a free slot
looks busy and a full one looks idler than it is; the filter then keeps a shared prefix on a
full pod while another has a slot free (bench/RESULTS.md, inference-perf's shared prefix). So
the price is learned together with a free depth `d`: the number of requests in flight that
delay nobody, the largest count of requests ahead whose first tokens waited, on average, less
than 15% of the pod's service time (and every smaller count too; queue_price.py passes
the bar). With `k` requests ahead, the tokens that count are the share `(k - d) / k` of those
in flight (none while `k <= d`). A pod seen to run 7 at once without delay is unbounded and
keeps the price alone; so does every pod while its service time is unknown (depth 0: the
price as it was before depths).

When the next count was seen to delay (the depth is bounded: the pod queues behind slots), the
wait is read instead from a replay of the pod (service_time.py): the requests in flight hold
their slots for what is left of a service time, the rest queue in order. That knows what the
price cannot, how soon the requests ahead end, and on two-slot pods it took inference-perf's
shared prefix from 1.22x to about 1.1x the oracle's p95 (bench/RESULTS.md). Both models
predict each sample before learning it; should the price's absolute misses fall clearly below
the replay's, the price is read again, except on a pod whose engine was seen full (its slots
come from its scrapes): that pod queues behind slots, and the replay stands.

This module is the arithmetic; queue_price.py feeds it from the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

#: Free depths considered: 0 .. DEPTHS - 1 requests in flight without delay (a pod that runs
#: more at once is taken as unbounded: its wait is priced, not replayed).
DEPTHS = 8
#: The replay stands on a bounded pod unless the price's misses were below this share of its.
PRICE_CLEARLY_BETTER = 0.7


def counted_share(requests_ahead: int | None, depth: int) -> float:
    """The share of the tokens in flight that delay a new request when `requests_ahead`
    requests are in flight and `depth` of them delay nobody (unknown count: all of them)."""
    if requests_ahead is None:
        return 1.0
    if requests_ahead <= depth:
        return 0.0
    return (requests_ahead - depth) / requests_ahead


class Fitted(NamedTuple):
    """What is learned of a pod's queue: its free depth, the seconds per prompt token in
    flight beyond it, whether its wait is read from the replay (its depth is bounded and the
    price has not foreseen the delays clearly better), and whether the depth is bounded (a
    count of requests ahead was seen to delay: the pod runs `depth` + 1 at once)."""

    depth: int
    price: float
    replay: bool
    bounded: bool = False


@dataclass(slots=True)
class _Fit:
    """Exponentially decayed sums of one pod's samples (recent ones weigh most)."""

    #: per free depth d, with x_d the tokens ahead that count at depth d and y the delay: sum
    #: x_d, and sum y and how many over the samples with x_d > 0
    x: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)
    y: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)
    n: list[int] = field(default_factory=lambda: [0] * DEPTHS)
    #: per count k of requests ahead (1 .. DEPTHS - 1; index 0 unused): sum of the delays,
    #: their weight and how many, to tell which counts delay nobody
    kd: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)
    kw: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)
    kn: list[int] = field(default_factory=lambda: [0] * DEPTHS)
    #: the absolute errors of the two models' predictions, each made before its sample was
    #: learned (with the fit of that moment), over the samples both could predict: the
    #: comparison that picks the model, not swayed much by the rare sample neither foresaw
    price_miss: float = 0.0
    time_miss: float = 0.0
    compared: int = 0
    #: best()'s answer since the last sample, and the free_below it was made for (the filter
    #: asks for every candidate, per request)
    cached: Fitted | None = None
    cached_for: float | None = None
    cached_depth: int | None = None
    fresh: bool = False

    def add(
        self,
        ahead: float,
        requests: int | None,
        delay: float,
        predicted: float | None,
        keep: float,
    ) -> None:
        self.fresh = False
        self.price_miss *= keep
        self.time_miss *= keep
        before = self.cached
        if predicted is not None and before is not None:
            by_price = ahead * counted_share(requests, before.depth) * before.price
            self.price_miss += abs(delay - by_price)
            self.time_miss += abs(delay - predicted)
            self.compared += 1
        kd, kw = self.kd, self.kw
        for k in range(1, DEPTHS):
            kd[k] *= keep
            kw[k] *= keep
        if requests is not None and 0 < requests < DEPTHS:
            kd[requests] += delay
            kw[requests] += 1.0
            self.kn[requests] += 1
        x, y, n = self.x, self.y, self.n
        for d in range(DEPTHS):
            x[d] *= keep
            y[d] *= keep
            xd = ahead * counted_share(requests, d)
            if xd > 0.0:
                x[d] += xd
                y[d] += delay
                n[d] += 1

    def price(self, depth: int) -> float:
        """Seconds per counted token at `depth` (a ratio of decayed sums: a least-squares slope
        through the origin weighing each sample by 1 / x)."""
        return self.y[depth] / self.x[depth]

    def best(
        self,
        min_samples: int,
        free_below: float | None,
        fleet: _Fit | None = None,
        depth: int | None = None,
    ) -> Fitted | None:
        """The free depth (the counts of requests ahead whose mean delay stays under
        `free_below` seconds; 0 while that is not known; a count this pod has too few samples
        of is judged by the `fleet`'s; `depth` when given, as bounded), its price, and
        whether the replay is read; None with too few samples."""
        was = self.cached_for
        if (
            not self.fresh
            or depth != self.cached_depth
            or (was is None) != (free_below is None)
            or (was is not None and free_below is not None and abs(free_below - was) > 0.05 * was)
        ):
            self.cached, self.fresh = self._best(min_samples, free_below, fleet, depth), True
            self.cached_for = free_below
            self.cached_depth = depth
        return self.cached

    def _depth(
        self, min_samples: int, free_below: float | None, fleet: _Fit | None
    ) -> tuple[int, bool]:
        """The free depth, and whether it is bounded (the next count was seen to delay)."""
        depth = 0
        if free_below is None:
            return depth, False
        for k in range(1, DEPTHS):
            seen = self if self.kn[k] >= min_samples else fleet
            if seen is None or seen.kn[k] < min_samples:
                return depth, False
            if seen.kd[k] > free_below * seen.kw[k]:
                return depth, True
            depth = k
        return depth, False

    def _best(
        self, min_samples: int, free_below: float | None, fleet: _Fit | None, known: int | None
    ) -> Fitted | None:
        if self.n[0] < min_samples or self.x[0] <= 0.0:
            return None
        if known is None:
            depth, bounded = self._depth(min_samples, free_below, fleet)
        else:
            depth, bounded = known, True
        price_depth = depth
        while price_depth and (self.n[price_depth] < min_samples or self.x[price_depth] <= 0.0):
            price_depth -= 1  # nothing seen beyond it yet: priced as the deepest depth that was
        price_better = (
            self.compared >= min_samples and self.price_miss < PRICE_CLEARLY_BETTER * self.time_miss
        )
        # A depth known from the pod's engine (seen full) is a queue of slots: the replay's
        # model, whatever the misses so far (a few early ones, made while the service time was
        # a guess, had the price read on a full pod at a third of its wait)
        replay = known is not None or (bounded and not price_better)
        return Fitted(depth, self.price(price_depth), replay, bounded)


class QueueDelay:
    """Seconds of first-token delay per prompt token in flight beyond a pod's free depth, per
    pod. A pod with fewer than `min_samples` samples borrows the fleet's fit; with neither,
    the caller's default (its prefill rate, depth 0) stands."""

    __slots__ = ("_fleet", "_keep", "_min", "_pods")

    def __init__(self, half_life: float = 32.0, min_samples: int = 4) -> None:
        self._keep = 0.5 ** (1.0 / half_life)
        self._min = min_samples
        self._pods: dict[str, _Fit] = {}
        self._fleet = _Fit()

    def observe(
        self,
        pod: str,
        ahead_tokens: float,
        delay: float,
        requests_ahead: int | None = None,
        predicted: float | None = None,
    ) -> None:
        """One first token: `delay` seconds beyond the request's own prefill, with
        `ahead_tokens` prompt tokens of `requests_ahead` requests in flight on `pod` when it was
        sent (None: not known, as from an older replica's journal), and `predicted` seconds of
        wait the replay of the pod foresaw then (None: it could not yet). Requests that had
        nothing ahead say nothing about the queue and are not counted."""
        if ahead_tokens <= 0.0:
            return
        delay = max(0.0, delay)
        fit = self._pods.get(pod)
        if fit is None:
            fit = self._pods[pod] = _Fit()
        fit.add(ahead_tokens, requests_ahead, delay, predicted, self._keep)
        self._fleet.add(ahead_tokens, requests_ahead, delay, predicted, self._keep)

    def forget(self, pod: str) -> None:
        """Drop `pod`'s own samples (it borrows the fleet's fit until it has new ones)."""
        self._pods.pop(pod, None)

    def fit(
        self, pod: str, free_below: float | None = None, depth: int | None = None
    ) -> Fitted | None:
        """What is learned of `pod`'s queue, the fleet's while it has too few samples of its
        own, None while nothing is learned. A count of requests ahead whose mean delay stays
        under `free_below` seconds is within the free depth (None: depth 0); a `depth` known
        otherwise (the pod's engine was seen full) is taken as it is, its wait read from the
        replay."""
        fit = self._pods.get(pod)
        learned = fit.best(self._min, free_below, self._fleet, depth) if fit is not None else None
        if learned is not None:
            return learned
        return self._fleet.best(self._min, free_below, None, depth)

    def seconds_per_token(self, pod: str, default: float, free_below: float | None = None) -> float:
        """`pod`'s learned seconds per counted prompt token ahead, or `default` while nothing
        is learned."""
        learned = self.fit(pod, free_below)
        return default if learned is None else learned.price
