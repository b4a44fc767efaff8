"""Lock-free metric families for the request path, exposed through prometheus-client.

prometheus-client's own Counter/Histogram take a lock and validate label values on every
call; on the gateway's hot path that was ~12% of its CPU per request (bench/RESULTS.md).
Everything here is touched only from the event loop's thread, so plain attribute updates
are safe; a Collector turns the values into prometheus-client metric families at scrape
time, and prometheus-client still does the exposition."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class GaugeChild(CounterChild):
    __slots__ = ()

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bucket i counts values <= bounds[i] (Prometheus "le" semantics)
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


C = TypeVar("C")


class _Family(Generic[C]):
    """Label values -> child, created on first use by `new`."""

    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str], new: Callable[[], C]
    ) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = tuple(labelnames)
        self._new = new
        self._children: dict[tuple[str, ...], C] = {}

    def labels(self, *values: str) -> C:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = self._new()
        return child


class CounterFamily(_Family[CounterChild]):
    def __init__(self, name: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, doc, labelnames, CounterChild)

    def collect(self) -> CounterMetricFamily:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in self._children.items():
            fam.add_metric(values, child.value)
        return fam


class GaugeFamily(_Family[GaugeChild]):
    def __init__(self, name: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, doc, labelnames, GaugeChild)

    def collect(self) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in self._children.items():
            fam.add_metric(values, child.value)
        return fam


class HistogramFamily(_Family[HistogramChild]):
    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str] = (), *, buckets: Iterable[float]
    ) -> None:
        self.buckets = tuple(sorted(buckets))
        super().__init__(name, doc, labelnames, lambda: HistogramChild(self.buckets))

    def collect(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in self._children.items():
            running = 0
            cumulative = []
            for bound, n in zip((*child.bounds, float("inf")), child.counts, strict=True):
                running += n
                cumulative.append((_le(bound), float(running)))
            fam.add_metric(values, cumulative, child.sum)
        return fam


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class FamiliesCollector(Collector):
    """Exposes a set of families through a prometheus-client registry."""

    def __init__(self, families: Iterable[CounterFamily | GaugeFamily | HistogramFamily]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        for family in self.families:
            yield family.collect()
