"""priority-holdback-policy: the lower a band's priority, the lower its ceiling, so that as
the pool fills, the least important traffic waits first and the capacity left goes to the
most important. The highest active band gets `maxCeiling`, the lowest `minCeiling`, the
others in between, spaced by rank (`domain: rank`) or by their priority values
(`domain: value`). One active band alone gets `maxCeiling`: nothing to hold back for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register

PRIORITY_HOLDBACK_TYPE = "priority-holdback-policy"


class PriorityHoldbackParams(PluginParams):
    #: The curve between the two ceilings; llm-d has only "linear".
    shape: Literal["linear"] = "linear"
    #: "rank": equal steps by rank, whatever the priority values; "value": steps in
    #: proportion to the gaps between the values.
    domain: Literal["rank", "value"] = "rank"
    #: The lowest band's ceiling. Required, as in llm-d: how hard to hold back the least
    #: important traffic has no default that suits every pool.
    min_ceiling: float = Field(ge=0.0, lt=1.0)
    #: The highest band's ceiling.
    max_ceiling: float = Field(default=1.0, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> PriorityHoldbackParams:
        if self.min_ceiling >= self.max_ceiling:
            raise ValueError(
                f"minCeiling ({self.min_ceiling:g}) must be below maxCeiling ({self.max_ceiling:g})"
            )
        return self


@register(PRIORITY_HOLDBACK_TYPE, PriorityHoldbackParams)
class PriorityHoldback(BasePlugin[PriorityHoldbackParams]):
    type = PRIORITY_HOLDBACK_TYPE

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> list[float]:
        lo, hi = self.params.min_ceiling, self.params.max_ceiling
        n = len(priorities)
        if n <= 1:
            return [hi] * n
        if self.params.domain == "rank":
            step = (hi - lo) / (n - 1)
            return [hi - i * step for i in range(n)]
        top, bottom = priorities[0], priorities[-1]
        if top == bottom:
            return [hi] * n
        return [lo + (p - bottom) / (top - bottom) * (hi - lo) for p in priorities]
