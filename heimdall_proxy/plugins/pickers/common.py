"""Parameters shared by the pickers."""

from __future__ import annotations

import random

from pydantic import Field

from heimdall_proxy.framework.params import PluginParams


class PickerParams(PluginParams):
    max_num_of_endpoints: int = Field(default=1, ge=1)


def make_rng() -> random.Random:
    """Each picker owns its generator, so tests can seed one without touching global state."""
    return random.Random()
