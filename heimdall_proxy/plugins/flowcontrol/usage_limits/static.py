"""static-usage-limit-policy: one ceiling for every priority. At the default 1.0 a band
dispatches until the pool is saturated (what the flow controller does with no policy); below
it, e.g. 0.8, requests wait while the pool is 80% full, keeping headroom for bursts the
detector has not seen yet."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register

STATIC_USAGE_LIMIT_TYPE = "static-usage-limit-policy"


class StaticUsageLimitParams(PluginParams):
    #: The ceiling of every band, in (0, 1] as llm-d documents it.
    threshold: float = Field(default=1.0, gt=0.0, le=1.0)


@register(STATIC_USAGE_LIMIT_TYPE, StaticUsageLimitParams)
class StaticUsageLimit(BasePlugin[StaticUsageLimitParams]):
    type = STATIC_USAGE_LIMIT_TYPE

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> list[float]:
        return [self.params.threshold] * len(priorities)
