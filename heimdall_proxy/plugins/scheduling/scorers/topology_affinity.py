"""topology-affinity-scorer: in a later stage's profile (prefill), prefers the pods close to
the pod the earlier stage chose (decode), graded by the link the KV cache would cross."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.topology import (
    Level,
    compare,
    peer_topology,
    read_topology,
    topology_key,
)
from heimdall_proxy.framework.types import CycleState, DefaultScores, Endpoint, InferenceRequest

TOPOLOGY_AFFINITY_SCORER_TYPE = "topology-affinity-scorer"

#: The score of the tightest tier shared with the peer, llm-d's fixed curve. It follows the
#: transfer bandwidth, not an even spacing: NVLink within a host is about 5x a single NIC hop
#: within a rack and 20x a zone's multi-hop fabric, so a shared host wins outright and the
#: looser tiers only break ties among pods that are not co-located.
LEVEL_SCORES = {
    Level.HOST: 1.0,
    Level.RACK: 0.2,
    Level.ZONE: 0.05,
    Level.REGION: 0.02,
    Level.NONE: 0.0,
}


class TopologyAffinityScorerParams(PluginParams):
    #: The topology-extractor instance whose Topology is read; empty: the unnamed one.
    topology_producer_name: str = ""


@register(TOPOLOGY_AFFINITY_SCORER_TYPE, TopologyAffinityScorerParams)
class TopologyAffinityScorer(BasePlugin[TopologyAffinityScorerParams]):
    """Scores each candidate by the tightest tier it shares with the peer pod
    disagg-profile-handler chose first: host 1.0, rack 0.2, zone 0.05, region 0.02, none 0.
    A candidate without a Topology, and every candidate when there is no peer (or the peer
    has no topology), scores 0: no signal, which adds nothing to the weighted sum."""

    type = TOPOLOGY_AFFINITY_SCORER_TYPE

    def __init__(
        self, name: str, params: TopologyAffinityScorerParams, handle: PluginHandle
    ) -> None:
        super().__init__(name, params, handle)
        self.key = topology_key(params.topology_producer_name)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        peer = peer_topology(state, self.key)
        changed: dict[str, float] = {}
        if peer is not None:
            for e in endpoints:
                score = LEVEL_SCORES[compare(peer, read_topology(e, self.key))]
                if score:
                    changed[e.name] = score
        return DefaultScores(endpoints, 0.0, changed)
