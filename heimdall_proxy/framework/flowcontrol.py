"""Flow control's contracts: saturation detectors, the policies that order a priority band's
queues, and the usage-limit policy that caps how full each band may fill the pool. Detectors
read the gateway's in-flight ledger (framework/inflight.py) beside the scraped metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from heimdall_proxy.framework.types import Endpoint, InferenceRequest


@runtime_checkable
class SaturationDetector(Protocol):
    """Judges how full a set of candidate pods is: 0.0 idle, 1.0 and above saturated (the
    flow controller holds or sheds requests for that pool)."""

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...


class FlowHead(NamedTuple):
    """One non-empty flow of a band as a fairness policy sees it. The first two fields are
    the (flow, key) pair older policies index."""

    #: The flow's id inside the band (its fairness id and model).
    flow: str
    #: Its head request's ordering key (the band's ordering policy): lowest goes first.
    key: float
    #: The fairness id its requests carry (the program, the tenant).
    fairness_id: str
    #: When its head request was queued (monotonic seconds).
    enqueued: float
    #: Requests waiting in the flow.
    length: int
    #: The head request itself.
    request: InferenceRequest


@runtime_checkable
class FairnessPolicy(Protocol):
    """Chooses which flow of a priority band dispatches next: the index into `flows` (the
    band's non-empty flows whose pool has room). `last` is the flow it chose last time."""

    def pick_flow(self, flows: Sequence[FlowHead], last: str | None) -> int: ...


@runtime_checkable
class OrderingPolicy(Protocol):
    """Orders the requests of one flow: the lowest key dispatches first (ties: arrival
    order). `arrival` is when the request was queued, `deadline` when its queue-wait budget
    runs out (inf without one), both monotonic seconds."""

    def order_key(self, arrival: float, deadline: float, request: InferenceRequest) -> float: ...


@runtime_checkable
class UsageLimitPolicy(Protocol):
    """How full each priority band may fill the pool before it waits (llm-d's
    UsageLimitPolicy). Asked once per dispatch decision with the pool's saturation and the
    active priorities, highest first; returns one ceiling per priority in [0, 1], never
    rising from one priority to the next lower one. A band dispatches only while the
    saturation is below its ceiling: 1.0 is no gating, 0.0 holds the band."""

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> list[float]: ...
