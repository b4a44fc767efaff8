"""Min-max normalisation shared by the count-based scorers."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.types import AlignedScores, DefaultScores, Endpoint


def inverted_min_max(endpoints: list[Endpoint], values: list[float]) -> Mapping[str, float]:
    """Score 1.0 for the smallest value and 0.0 for the largest, linear in between; 1.0 for
    every endpoint when all values are equal.

    All equal (every idle pool, and always with one pod) is answered as `DefaultScores`,
    which costs the same at any pool size instead of a dict entry per pod. `min`/`max` get
    no `default=`: a builtin's keyword argument costs more than the comparison (counted
    per request with bench/probes/instructions.py)."""
    if not values:
        return {}
    lo = min(values)
    hi = max(values)
    if hi == lo:
        return DefaultScores(endpoints, 1.0, {})
    span = hi - lo
    return AlignedScores(endpoints, [(hi - v) / span for v in values])
