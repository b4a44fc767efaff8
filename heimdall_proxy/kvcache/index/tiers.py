"""Storage tiers (GPU, CPU, disk) and their weights in a lookup."""

from __future__ import annotations

from collections.abc import Mapping

#: Storage tiers in a fixed slot order (the Redis layout depends on it); vLLM's `medium`
#: is matched case-insensitively, a missing medium is the GPU.
TIERS = ("gpu", "cpu", "disk")
DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8, "disk": 0.5}


#: Engines' names for a tier other than the tier's own: SGLang's StorageMedium.CPU.
_ALIASES = {"cpu_pinned": "cpu"}


def tier_of(medium: str | None) -> str:
    """The tracked name of an engine's medium: lower case, none meaning the GPU, aliases
    resolved; media that are no tier (SGLang's EXTERNAL, ...) keep their own name."""
    if not medium:
        return "gpu"
    name = medium.lower()
    return _ALIASES.get(name, name)


def tier_weights(overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    weights = dict(DEFAULT_TIER_WEIGHTS)
    for name, weight in (overrides or {}).items():
        key = name.lower()
        if key not in TIERS:
            raise ValueError(f"unknown storage tier {name!r} (known: {', '.join(TIERS)})")
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"tier weight of {name!r} must be in [0, 1], got {weight}")
        weights[key] = float(weight)
    return weights
