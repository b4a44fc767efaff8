"""What the pickers share: their parameters and their random generator."""

from __future__ import annotations

import random

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams


class PickerParams(PluginParams):
    max_num_of_endpoints: int = Field(default=1, ge=1)


class PickerBase(BasePlugin[PickerParams]):
    """Holds `maxNumOfEndpoints` as `self._k` and a generator of the picker's own, so tests can
    seed one (`picker.rng.seed(...)`) without touching global state."""

    def __init__(self, name: str, params: PickerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.rng = random.Random()
        self._k = params.max_num_of_endpoints
