"""Parameter models: pydantic with the reference's camelCase names, and Go duration strings."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
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


#: The smallest number a duration may be given as (nanoseconds).
NANOS_PER_MS = 1_000_000


def _duration_validator(value: Any) -> Any:
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, bool):
        raise ValueError("a duration must be a string such as '30s'")
    if isinstance(value, int | float) and value == 0:
        return 0.0
    if isinstance(value, int) and value >= NANOS_PER_MS:
        # Go decodes a number into a time.Duration as nanoseconds, and llm-d's configs write
        # some durations so (metricsLoggingInterval: 60000000000). Smaller numbers are far
        # likelier seconds written without a unit, and are refused rather than read as ns.
        return value / 1e9
    raise ValueError(
        "a duration must be a string such as '30s', '2m' or '500ms' (or a whole number of "
        "nanoseconds, at least 1 ms)"
    )


#: A Go duration string in the YAML, seconds (float) in Python.
Duration = Annotated[float, BeforeValidator(_duration_validator)]


def _request_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"path must start with '/', got {value!r}")
    return value


#: An HTTP request path on a pod (a data source's `path`): absolute, starting with '/'.
RequestPath = Annotated[str, AfterValidator(_request_path)]


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


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
_QUANTITY_SCALE = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(value: str | int | float) -> int:
    """A Kubernetes resource quantity ("1Gi", "500M", "1k", "100", or a number) as an int,
    rounded up as Kubernetes does. Raises ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError("a quantity must be a number or a string such as '1Gi'")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a quantity must not be negative")
        return int(-(-value // 1))
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise ValueError(f"invalid quantity {value!r} (want e.g. '100', '1k', '500M', '1Gi')")
    number = float(match.group(1)) * _QUANTITY_SCALE[match.group(2)]
    return int(-(-number // 1))


#: A Kubernetes quantity in the YAML ("1Gi", "5k", 100), an int in Python.
Quantity = Annotated[int, BeforeValidator(parse_quantity)]


#: An XXH3-64 seed (`hashSeed`): the scorer's conductorConfig and the conductor's config file
#: must agree on it, so both read it with this one range.
HashSeed = Annotated[int, Field(ge=0, lt=1 << 64)]
