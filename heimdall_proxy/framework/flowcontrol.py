"""Flow control's contracts: the in-flight ledger, saturation detectors, and the policies
that order a priority band's queues.

The gateway keeps one `InFlightLoad` ledger: requests it has sent to each pod and not yet
seen finish, and requests it has let through admission but not yet sent anywhere (`pending`).
Scraped metrics lag by up to a scrape interval; the ledger does not, so detectors read both,
and a burst cannot slip past a detector between two scrapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from heimdall_proxy.framework.types import Endpoint


class InFlightLoad:
    """Per-pod requests and estimated prompt tokens in flight through this gateway, plus the
    admitted requests not yet sent. Single-threaded (the event loop), so plain counters."""

    __slots__ = ("count_tokens", "pending", "requests", "sent", "tokens")

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        #: Whether anything reads `tokens` (a detector in tokens or hybrid mode sets it).
        #: Until then the relay does not estimate a request's prompt tokens for the ledger:
        #: that walks the messages, and with the EPP's default plugins nothing else does.
        self.count_tokens = False
        #: Admitted by flow control, not yet sent to a pod.
        self.pending = 0
        #: Requests ever sent to each pod: the data layer compares it between scrapes to
        #: tell a pod nobody has touched (datalayer/cadence.py).
        self.sent: dict[str, int] = {}

    def acquire(self, pod: str, tokens: int) -> None:
        self.requests[pod] = self.requests.get(pod, 0) + 1
        self.sent[pod] = self.sent.get(pod, 0) + 1
        self.tokens[pod] = self.tokens.get(pod, 0) + tokens

    def touch(self, pod: str) -> None:
        """Count a request sent to `pod` outside the ledger's in-flight accounting (a
        disaggregation hop), so the data layer knows the pod was disturbed."""
        self.sent[pod] = self.sent.get(pod, 0) + 1

    def release(self, pod: str, tokens: int) -> None:
        left = self.requests.get(pod, 0) - 1
        if left > 0:
            self.requests[pod] = left
            tokens_left = self.tokens.get(pod, 0) - tokens
            self.tokens[pod] = tokens_left if tokens_left > 0 else 0  # max(): a builtin call
        else:
            self.requests.pop(pod, None)
            self.tokens.pop(pod, None)


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
