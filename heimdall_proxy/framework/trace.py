"""A record of one scheduling cycle, for the debug route: what each profile's filters kept,
every scorer's raw and weighted score per pod, the totals and the pick.

The scheduler records into it only when one is on the CycleState (`TRACE_KEY`), so the
request path pays one dict lookup per profile run and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: CycleState key of the ScheduleTrace a cycle should record into.
TRACE_KEY = "heimdall/schedule-trace"


@dataclass(slots=True)
class ScorerTrace:
    name: str
    weight: float
    #: what the scorer returned, per pod (before clamping to [0, 1])
    raw: dict[str, float]

    def weighted(self) -> dict[str, float]:
        """The scorer's contribution to each pod's total: weight x the score clamped to
        [0, 1] (a NaN or negative score counts 0), exactly as the scheduler adds it."""
        out = {}
        for pod, value in self.raw.items():
            clamped = 0.0 if not value > 0.0 else min(1.0, value)
            out[pod] = self.weight * clamped
        return out


@dataclass(slots=True)
class ProfileTrace:
    name: str
    candidates: list[str]
    #: (filter name, pods it kept), in order
    filters: list[tuple[str, list[str]]] = field(default_factory=list)
    scorers: list[ScorerTrace] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    picked: list[str] = field(default_factory=list)
    ranked: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.name,
            "candidates": self.candidates,
            "filters": [{"filter": n, "kept": kept} for n, kept in self.filters],
            "scorers": [
                {"scorer": s.name, "weight": s.weight, "raw": s.raw, "weighted": s.weighted()}
                for s in self.scorers
            ],
            "totals": self.totals,
            "picked": self.picked,
            "ranked": self.ranked,
        }


@dataclass(slots=True)
class ScheduleTrace:
    profiles: list[ProfileTrace] = field(default_factory=list)

    def begin(self, profile: str, candidates: list[str]) -> ProfileTrace:
        trace = ProfileTrace(profile, candidates)
        self.profiles.append(trace)
        return trace
