"""Parameter models: pydantic with the reference's camelCase names, and Go duration strings."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic.alias_generators import to_camel

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(value: str) -> float:
    """Parse a Go duration string ("2m", "1h30m", "500ms", "1.5s", "0") into seconds.

    Raises ValueError on anything Go's time.ParseDuration would reject (a missing unit,
    an unknown unit, stray characters)."""
    text = value.strip()
    if not text:
        raise ValueError("empty duration")
    sign = 1.0
    if text[0] in "+-":
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
        if not text:  # a bare sign: Go rejects it, the loop below would return 0
            raise ValueError(f"invalid duration {value!r} (want e.g. '30s', '2m', '500ms')")
    if text == "0":
        return 0.0
    pos = 0
    total = 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise ValueError(f"invalid duration {value!r} (want e.g. '30s', '2m', '500ms')")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return sign * total


def _duration_validator(value: Any) -> Any:
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, bool):
        raise ValueError("a duration must be a string such as '30s'")
    if isinstance(value, int | float) and value == 0:
        return 0.0
    raise ValueError("a duration must be a string such as '30s', '2m' or '500ms'")


#: A Go duration string in the YAML, seconds (float) in Python.
Duration = Annotated[float, BeforeValidator(_duration_validator)]


class PluginParams(BaseModel):
    """Base of every plugin's parameter model: fields are snake_case in Python and camelCase
    in YAML, as in Heimdall. Unknown keys are kept in `model_extra` so the loader can warn
    about them (Heimdall ignores them, so a values file that loads there loads here)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        frozen=True,
    )


class NoParams(PluginParams):
    """For plugins that take no parameters."""
