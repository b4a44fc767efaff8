"""The gateway's queues: one priority band per priority, one flow per fairness id and model,
requests ordered inside a flow by the band's ordering policy. Removal is lazy (a request that
leaves early is marked and skipped), so a client hang-up costs O(1)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from heimdall_proxy.config.flow import PriorityBandConfig
from heimdall_proxy.framework.flowcontrol import FairnessPolicy, OrderingPolicy
from heimdall_proxy.framework.types import Endpoint, InferenceRequest

_seq = itertools.count()


def flow_id(item: Queued) -> str:
    """The flow a request waits in: one per fairness id and model, so that a saturated model
    never holds up another model's requests."""
    return f"{item.request.fairness_id}\x00{item.request.model}"


@dataclass(eq=False, slots=True)
class Queued:
    """One waiting request. `waiter` resolves when the dispatcher lets it go."""

    request: InferenceRequest
    #: The pods whose room decides when it goes (its candidates when it arrived).
    candidates: Sequence[Endpoint]
    size: int
    arrival: float
    deadline: float
    waiter: asyncio.Future[None]
    key: tuple[float, int] = (0.0, 0)
    gone: bool = False
    #: Released by the dispatcher (and counted as pending in the in-flight ledger).
    released: bool = False


@dataclass(eq=False, slots=True)
class Flow:
    heap: list[tuple[tuple[float, int], Queued]] = field(default_factory=list)
    #: Requests in it that have not left (the heap also holds some that have).
    live: int = 0

    def head(self) -> Queued | None:
        heap = self.heap
        while heap and heap[0][1].gone:
            heapq.heappop(heap)
        return heap[0][1] if heap else None


@dataclass(eq=False, slots=True)
class Band:
    config: PriorityBandConfig
    fairness: FairnessPolicy
    ordering: OrderingPolicy
    flows: dict[str, Flow] = field(default_factory=dict)
    count: int = 0
    bytes: int = 0
    last_flow: str | None = None

    @property
    def priority(self) -> int:
        return self.config.priority

    def push(self, item: Queued) -> None:
        key = self.ordering.order_key(item.arrival, item.deadline, item.request)
        item.key = (key, next(_seq))
        flow = self.flows.setdefault(flow_id(item), Flow())
        heapq.heappush(flow.heap, (item.key, item))
        flow.live += 1
        self.count += 1
        self.bytes += item.size

    def remove(self, item: Queued) -> None:
        """Take `item` out (it is skipped when it reaches its flow's head)."""
        if not item.gone:
            item.gone = True
            self.count -= 1
            self.bytes -= item.size
            flow = self.flows.get(flow_id(item))
            if flow is not None:
                flow.live -= 1

    def heads(self) -> Iterator[tuple[str, Queued, int]]:
        """Every flow's head and how many wait in the flow, dropping flows that emptied."""
        for fid in list(self.flows):
            flow = self.flows[fid]
            head = flow.head()
            if head is None:
                del self.flows[fid]
            else:
                yield fid, head, flow.live

    def items(self) -> Iterator[Queued]:
        for flow in self.flows.values():
            for _, item in flow.heap:
                if not item.gone:
                    yield item
