"""topology-affinity-filter: in a later stage's profile (prefill), keeps the pods close to the
pod the earlier stage chose (decode), so the KV cache travels over the fastest link."""

from __future__ import annotations

from typing import Literal

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.topology import (
    LEVEL_NAMES,
    compare,
    peer_topology,
    read_topology,
    topology_key,
)
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

TOPOLOGY_AFFINITY_FILTER_TYPE = "topology-affinity-filter"


class TopologyAffinityFilterParams(PluginParams):
    #: The loosest tier a pod may share with the peer and pass.
    min_affinity: Literal["host", "rack", "zone", "region"] = "host"
    #: The topology-extractor instance whose Topology is read; empty: the unnamed one.
    topology_producer_name: str = ""


@register(TOPOLOGY_AFFINITY_FILTER_TYPE, TopologyAffinityFilterParams)
class TopologyAffinityFilter(BasePlugin[TopologyAffinityFilterParams]):
    """Keeps the candidates that share at least `minAffinity` (host, rack, zone or region;
    a shared host implies the rest) with the peer pod disagg-profile-handler chose first.
    A candidate without a Topology, or without the compared field, does not pass.

    Affinity is a preference, never a reason to refuse a request, so the filter fails open:
    with no peer (no earlier stage, or a peer without topology) or when no candidate is
    close enough, every candidate passes. `minAffinity: host` assumes the host is the
    NVLink domain; on rack-scale NVLink (NVL72) use `rack`."""

    type = TOPOLOGY_AFFINITY_FILTER_TYPE

    def __init__(
        self, name: str, params: TopologyAffinityFilterParams, handle: PluginHandle
    ) -> None:
        super().__init__(name, params, handle)
        self.key = topology_key(params.topology_producer_name)
        self.min_affinity = LEVEL_NAMES[params.min_affinity]

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        peer = peer_topology(state, self.key)
        if peer is None:
            return endpoints
        key, floor = self.key, self.min_affinity
        kept = [e for e in endpoints if compare(peer, read_topology(e, key)) <= floor]
        return kept or endpoints
