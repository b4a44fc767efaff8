"""data-parallel-profile-handler (deprecated in llm-d): one profile; the request goes to the
pod's primary port, which is told the rank the profile picked."""

from __future__ import annotations

import logging

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    RequestContext,
    SchedulingResult,
)
from heimdall_proxy.plugins.scheduling.profiles.single import OneProfile

DATA_PARALLEL_PROFILE_HANDLER_TYPE = "data-parallel-profile-handler"
#: Upstream request header naming the rank picked (host:port), llm-d's.
DATA_PARALLEL_ENDPOINT_HEADER = "x-data-parallel-host-port"

#: CycleState key of the profile's result before the ports were rewritten.
PICKED_KEY = "data-parallel/picked"

log = logging.getLogger(__name__)


class DataParallelParams(PluginParams):
    #: The port every request is sent to; 0 keeps each pick's own port.
    primary_port: int = Field(default=8000, ge=0, le=65535)


@register(DATA_PARALLEL_PROFILE_HANDLER_TYPE, DataParallelParams)
class DataParallelProfileHandler(OneProfile, BasePlugin[DataParallelParams]):
    """Runs the one scheduling profile. Each rank of a data-parallel server is a pod of the
    pool with its own port; the request is sent to `primaryPort` on the picked pod's host,
    with `x-data-parallel-host-port` naming the rank picked (its own host:port), for the
    server's front to hand it on. The fallback order is rewritten the same way, and each
    attempt names its own rank.

    Deprecated in llm-d in favour of single-profile-handler (Istio 1.28.1 routes to the
    rank's port directly); kept so its configs load unchanged."""

    type = DATA_PARALLEL_PROFILE_HANDLER_TYPE

    def __init__(self, name: str, params: DataParallelParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.primary_port = params.primary_port
        log.warning(
            "plugin %r: %s is deprecated (in llm-d too); single-profile-handler sends each "
            "request to the picked rank's own port",
            name,
            self.type,
        )

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        name, result = self.the_result(results)
        if self.primary_port:
            port = self.primary_port
            picked = state[PICKED_KEY] = result

            def rank() -> list[Endpoint]:
                return [e.with_port(port) for e in picked.ranked]

            results = {name: ProfileResult([e.with_port(port) for e in result.targets], rank=rank)}
        return SchedulingResult(results, name)

    async def pre_request(self, ctx: RequestContext) -> None:
        """Name the rank of this attempt's pod: its own host:port, before the rewrite (the
        ranking is read only for a fallback attempt)."""
        target = ctx.target
        picked = ctx.state.get(PICKED_KEY)
        if isinstance(picked, ProfileResult):
            own = next((e for e in picked.targets if e.name == target.name), None)
            if own is None:
                own = next((e for e in picked.ranked if e.name == target.name), None)
            target = own or target
        ctx.upstream_headers[DATA_PARALLEL_ENDPOINT_HEADER] = target.hostport
