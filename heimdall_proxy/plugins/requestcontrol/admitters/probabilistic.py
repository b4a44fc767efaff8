"""probabilistic-admitter: sheds sheddable requests (priority < 0) with a probability that
rises steeply with the pool's load, and always admits the others.

A hard saturation gate passes every sheddable request until the pool is full and then none;
this one starts shedding a few as load builds and most well before saturation, so the
critical traffic keeps its latency. The load is the mean over the candidates of
max(waiting / queueDepthThreshold, KV usage / kvCacheUtilThreshold) (a pod never scraped
counts 1.0); the chance of refusal is min(load ** power * k, 1). With the defaults (power 5,
k 300) almost nothing is shed below 0.1, about 2% at 0.15, 73% at 0.3 and all from about
0.32 ((1/k) ** (1/power)) on."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

PROBABILISTIC_ADMITTER_TYPE = "probabilistic-admitter"


class ProbabilisticAdmitterParams(PluginParams):
    #: A pod's waiting requests at which its load counts 1.0.
    queue_depth_threshold: int = Field(default=5, gt=0)
    #: A pod's KV-cache usage (0-1) at which its load counts 1.0.
    kv_cache_util_threshold: float = Field(default=0.8, gt=0.0)
    #: The curve's steepness: higher keeps a longer dead zone at low load, then a sharper rise.
    power: float = Field(default=5.0, gt=0.0)
    #: Where the curve rises: everything sheddable is refused from load (1/k) ** (1/power).
    k: float = Field(default=300.0, gt=0.0)


@register(PROBABILISTIC_ADMITTER_TYPE, ProbabilisticAdmitterParams)
class ProbabilisticAdmitter(BasePlugin[ProbabilisticAdmitterParams]):
    """Admitter. Reads the pods' scraped queue and KV usage only: its load is the pods' own
    account, like llm-d's, not the gateway's in-flight ledger."""

    type = PROBABILISTIC_ADMITTER_TYPE
    #: The `code` of the 429 it answers (as flow control sheds a sheddable request).
    refusal_code = "pool_saturated"

    def __init__(
        self,
        name: str,
        params: ProbabilisticAdmitterParams,
        handle: PluginHandle,
        rand: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(name, params, handle)
        #: A uniform draw in [0, 1): tests pass their own to pin the outcome.
        self.rand = rand

    def load(self, endpoints: Sequence[Endpoint]) -> float:
        """The candidates' mean load, as the shedding curve reads it."""
        p = self.params
        total = 0.0
        for ep in endpoints:
            m = ep.metrics
            if m.updated_at == 0.0:  # never scraped: nothing says it has room
                total += 1.0
                continue
            total += max(
                m.waiting / p.queue_depth_threshold, m.kv_cache_usage / p.kv_cache_util_threshold
            )
        return total / len(endpoints)

    def shed_probability(self, load: float) -> float:
        return min(float(load**self.params.power) * self.params.k, 1.0)

    def admit_request(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> str | None:
        if request.priority >= 0 or not endpoints:
            return None
        load = self.load(endpoints)
        chance = self.shed_probability(load)
        if self.rand() < chance:
            return (
                f"The pool is loaded ({load:.3f}) and the request is sheddable (objective "
                f"{request.objective!r}, priority {request.priority}): shed with probability "
                f"{chance:.2f}; retry later."
            )
        return None
