"""Admission: every rule that may hold or refuse an inference request before it reaches a pod,
in one place.

Two steps, in llm-d's order, both run by the director:

1. `enter`: flow control (server/flow). The configured saturation detector judges the
   request's candidate pods; a saturated pool queues the request (with the `flowControl`
   feature gate) or sheds it when sheddable (priority < 0). Runs before the producers, so a
   request that waits costs no tokenization or prefix lookup.
2. `admit`: the admitter plugins (e.g. latency-slo-admitter). They read what the producers
   published (predictions, prefix matches), so they run after them, before scheduling.

What is not here, on purpose: the gateway key and the body's size and encoding are judged by
the transport (server/auth.py, server/gateway.py) before a request is parsed; a pod's health
(outlier ejection) decides which pods are candidates, not whether the request is let in; the
retry budget decides whether a failed attempt gets another pod, not whether the request is
served."""

from __future__ import annotations

from collections.abc import Sequence

from heimdall_proxy.flowcontrol.controller import Admission, FlowController
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.plugins import Admitter
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest


class AdmissionControl:
    """Flow control plus the admitter plugins of one routing."""

    __slots__ = ("admitters", "flow")

    def __init__(self, flow: FlowController | None, admitters: Sequence[Admitter]) -> None:
        self.flow = flow
        self.admitters = tuple(admitters)

    async def enter(
        self, ireq: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> Admission | None:
        """Let `ireq` in now, or once its pool has room (None: no flow control to count it
        in). Raises RequestError(429) when it is shed, (503) when its wait runs out. The
        caller must `finish()` the admission once the request is over."""
        if self.flow is None:
            return None
        return await self.flow.admit(ireq, candidates)

    def admit(self, state: CycleState, ireq: InferenceRequest, candidates: list[Endpoint]) -> None:
        """Ask every admitter plugin, in declaration order; the first refusal answers the
        client with a 429 and its reason."""
        for admitter in self.admitters:
            reason = admitter.admit_request(state, ireq, candidates)
            if reason is not None:
                raise RequestError(
                    429,
                    reason,
                    type="rate_limit_exceeded",
                    # an admitter may name its refusal (probabilistic-admitter: pool_saturated)
                    code=getattr(admitter, "refusal_code", "slo_unattainable"),
                    headers={"Retry-After": "1"},
                )
