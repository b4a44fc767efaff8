"""topology-affinity-scorer: llm-d's fixed curve by the tier shared with the decode pick."""

from __future__ import annotations

from heimdall_proxy.framework.disagg import PEER_ENDPOINT_KEY
from heimdall_proxy.framework.topology import Topology, topology_key
from heimdall_proxy.framework.types import CycleState, Endpoint
from heimdall_proxy.plugins.scheduling.scorers.topology_affinity import (
    TopologyAffinityScorer,
    TopologyAffinityScorerParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req


def pod(name: str, topo: Topology | None) -> Endpoint:
    e = ep(name)
    if topo is not None:
        e.attributes[topology_key()] = topo
    return e


PEER = pod("decode", Topology("h1", "r1", "z1", "eu"))
PODS = [
    pod("host", Topology("h1", "r9", "z9", "xx")),  # same host wins, whatever the rest says
    pod("rack", Topology("h2", "r1", "z1", "eu")),
    pod("zone", Topology("h3", "r2", "z1", "eu")),
    pod("region", Topology("h4", "r3", "z2", "eu")),
    pod("none", Topology("h5", "r4", "z3", "us")),
    pod("unknown", None),
]


def scores(peer: Endpoint | None) -> dict[str, float]:
    scorer = TopologyAffinityScorer("t", TopologyAffinityScorerParams(), ledger())
    state = CycleState()
    if peer is not None:
        state[PEER_ENDPOINT_KEY] = peer
    return dict(scorer.score(state, req(), PODS))


def test_the_curve() -> None:
    assert scores(PEER) == {
        "host": 1.0,
        "rack": 0.2,
        "zone": 0.05,
        "region": 0.02,
        "none": 0.0,
        "unknown": 0.0,
    }


def test_no_peer_or_a_peer_without_topology_scores_zero_everywhere() -> None:
    assert set(scores(None).values()) == {0.0}
    assert set(scores(pod("bare", None)).values()) == {0.0}
