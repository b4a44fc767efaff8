"""Min-max normalisation shared by the count-based scorers."""

from __future__ import annotations

from heimdall_proxy.framework.types import Endpoint


def inverted_min_max(endpoints: list[Endpoint], values: list[float]) -> dict[str, float]:
    """Score 1.0 for the smallest value and 0.0 for the largest, linear in between; 1.0 for
    every endpoint when all values are equal."""
    lo = min(values, default=0.0)
    hi = max(values, default=0.0)
    if hi == lo:
        return {e.name: 1.0 for e in endpoints}
    span = hi - lo
    return {e.name: (hi - v) / span for e, v in zip(endpoints, values, strict=True)}
