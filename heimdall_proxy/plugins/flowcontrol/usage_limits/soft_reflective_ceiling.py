"""soft-reflective-ceiling-policy: a ceiling per band that falls with both its rank and the
pool's saturation, and that throttles a band past it instead of shutting it.

Band i of N (highest priority first) has the reflective ceiling 1 - i * saturation / (N - 1):
the highest band is never held below saturation 1.0, the lowest is held once saturation
reaches 1 - saturation (0.5). A band at or past its ceiling is not closed outright: all such
bands open together on one dispatch decision in `period` = round(saturation / (1 -
saturation)), so their dispatch rate falls smoothly as the pool fills (about (1 - s) / s)
where a fixed threshold would cut it to zero. At saturation 1.0 they are all held. No
parameters: the schedule follows from the saturation and the number of active bands."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from pydantic import ConfigDict

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register

SOFT_REFLECTIVE_CEILING_TYPE = "soft-reflective-ceiling-policy"


class SoftReflectiveCeilingParams(PluginParams):
    """None; any key is an error at load, as llm-d's strict decoder makes it."""

    model_config = ConfigDict(extra="forbid")


@register(SOFT_REFLECTIVE_CEILING_TYPE, SoftReflectiveCeilingParams)
class SoftReflectiveCeiling(BasePlugin[SoftReflectiveCeilingParams]):
    """One tick shared by every gated band, advanced once per decision in which some band is
    gated: on any decision either all gated bands are open or none is, so the ceilings stay
    monotone in rank (the controller serves bands highest first; bands with their own phase
    would starve a lower one on a higher one's closed ticks)."""

    type = SOFT_REFLECTIVE_CEILING_TYPE

    def __init__(
        self, name: str, params: SoftReflectiveCeilingParams, handle: PluginHandle
    ) -> None:
        super().__init__(name, params, handle)
        self._tick = itertools.count(1)

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> list[float]:
        n = len(priorities)
        if n <= 1:
            return [1.0] * n
        # ceilings fall with rank, so some band is gated iff the lowest one (1 - s) is
        gating = 1.0 - saturation <= saturation < 1.0
        opened = False
        if gating:
            # the epsilon keeps saturations a hair below 1.0 from dividing by ~0; halves round
            # up (Go's math.Round), not to even
            period = max(1, math.floor(saturation / (1.0 - saturation + 1e-9) + 0.5))
            opened = next(self._tick) % period == 0
        ceilings = [1.0]
        for i in range(1, n):
            reflective = 1.0 - i * saturation / (n - 1)
            if saturation < reflective:
                ceilings.append(1.0)
            elif saturation >= 1.0:
                ceilings.append(0.0)
            else:
                ceilings.append(1.0 if opened else 0.0)
        return ceilings
