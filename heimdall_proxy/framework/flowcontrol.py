"""Flow control's contracts: saturation detectors and the policies that order a priority
band's queues. Detectors read the gateway's in-flight ledger (framework/inflight.py) beside
the scraped metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from heimdall_proxy.framework.types import Endpoint


@runtime_checkable
class SaturationDetector(Protocol):
    """Judges how full a set of candidate pods is: 0.0 idle, 1.0 and above saturated (the
    flow controller holds or sheds requests for that pool)."""

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...


@runtime_checkable
class FairnessPolicy(Protocol):
    """Chooses which flow (fairness id) of a priority band dispatches next. `flows` are the
    band's non-empty flows, each as (fairness id, arrival time of its head request)."""

    def pick_flow(self, flows: Sequence[tuple[str, float]], last: str | None) -> int: ...


@runtime_checkable
class OrderingPolicy(Protocol):
    """Orders the requests of one flow: the lowest key dispatches first."""

    def order_key(self, arrival: float, deadline: float) -> float: ...
