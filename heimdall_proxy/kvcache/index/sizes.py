"""Sizes as the reference writes them ("2GiB", "500MiB")."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1}
for _i, _u in enumerate("KMGT", start=1):
    _UNITS[_u] = _UNITS[_u + "B"] = 1000**_i
    _UNITS[_u + "I"] = _UNITS[_u + "IB"] = 1024**_i


def parse_bytes(value: str | int) -> int:
    """ "2GiB", "500MiB", "1GB", "4096" -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError("a size must be positive")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise ValueError(f"invalid size {value!r} (want e.g. '2GiB', '500MiB')")
    unit = (match.group(2) or "").upper()
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError("a size must be positive")
    return size
