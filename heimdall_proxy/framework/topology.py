"""Where a pod runs (host, rack, zone, region), as topology-extractor publishes it on the
Endpoint and the topology-affinity filter and scorer compare it with the pod a request's
earlier stage chose (llm-d's attribute/topology and scheduling/util/topology)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from heimdall_proxy.framework.disagg import PEER_ENDPOINT_KEY
from heimdall_proxy.framework.types import CycleState, Endpoint

TOPOLOGY_EXTRACTOR_TYPE = "topology-extractor"
TOPOLOGY_ATTRIBUTE = "Topology"


def topology_key(producer_name: str = "") -> tuple[str, str]:
    """Where the topology-extractor called `producer_name` (default: its type name, the
    name of an unnamed instance) publishes on an Endpoint."""
    return (TOPOLOGY_ATTRIBUTE, producer_name or TOPOLOGY_EXTRACTOR_TYPE)


@dataclass(frozen=True, slots=True)
class Topology:
    """A pod's locality; "" where its labels do not say."""

    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


class Level(IntEnum):
    """Tiers a pod can share with another, tightest first: a shared host implies a shared
    rack, zone and region; NONE means no tier in common."""

    HOST = 0
    RACK = 1
    ZONE = 2
    REGION = 3
    NONE = 4


#: The config's names of the levels a `minAffinity` may give.
LEVEL_NAMES = {"host": Level.HOST, "rack": Level.RACK, "zone": Level.ZONE, "region": Level.REGION}


def compare(peer: Topology | None, candidate: Topology | None) -> Level:
    """The tightest level at which the two share a value. An empty value never matches,
    not even another empty one: a pod whose host is unknown is never "on the same host"."""
    if peer is None or candidate is None:
        return Level.NONE
    if peer.hostname and peer.hostname == candidate.hostname:
        return Level.HOST
    if peer.rack and peer.rack == candidate.rack:
        return Level.RACK
    if peer.zone and peer.zone == candidate.zone:
        return Level.ZONE
    if peer.region and peer.region == candidate.region:
        return Level.REGION
    return Level.NONE


def read_topology(endpoint: Endpoint, key: tuple[str, str]) -> Topology | None:
    value = endpoint.attributes.get(key)
    return value if isinstance(value, Topology) else None


def peer_topology(state: CycleState, key: tuple[str, str]) -> Topology | None:
    """The topology of the pod the earlier stage chose, None when there is no such pod or
    it has no topology (or only empty fields: nothing to be close to)."""
    peer = state.get(PEER_ENDPOINT_KEY)
    if not isinstance(peer, Endpoint):
        return None
    topo = read_topology(peer, key)
    if topo is None or not (topo.hostname or topo.rack or topo.zone or topo.region):
        return None
    return topo
