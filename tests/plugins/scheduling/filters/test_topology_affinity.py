"""topology-affinity-filter: the prefill candidates near the decode pick, failing open."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.disagg import PEER_ENDPOINT_KEY
from heimdall_proxy.framework.topology import Topology, topology_key
from heimdall_proxy.framework.types import CycleState, Endpoint
from heimdall_proxy.plugins.scheduling.filters.topology_affinity import (
    TopologyAffinityFilter,
    TopologyAffinityFilterParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req


def pod(name: str, topo: Topology | None, producer: str = "") -> Endpoint:
    e = ep(name)
    if topo is not None:
        e.attributes[topology_key(producer)] = topo
    return e


DECODE = pod("decode", Topology("h1", "r1", "z1", "eu"))
SAME_HOST = pod("same-host", Topology("h1", "r1", "z1", "eu"))
SAME_RACK = pod("same-rack", Topology("h2", "r1", "z1", "eu"))
SAME_ZONE = pod("same-zone", Topology("h3", "r2", "z1", "eu"))
SAME_REGION = pod("same-region", Topology("h4", "r3", "z2", "eu"))
FAR = pod("far", Topology("h5", "r4", "z3", "us"))
UNKNOWN = pod("unknown", None)
CANDIDATES = [FAR, SAME_REGION, SAME_ZONE, SAME_RACK, SAME_HOST, UNKNOWN]


def kept(min_affinity: str | None, candidates: list[Endpoint], peer: Endpoint | None) -> list[str]:
    params = {"minAffinity": min_affinity} if min_affinity else {}
    flt = TopologyAffinityFilter("t", TopologyAffinityFilterParams.model_validate(params), ledger())
    state = CycleState()
    if peer is not None:
        state[PEER_ENDPOINT_KEY] = peer
    return [e.name for e in flt.filter(state, req(), candidates)]


@pytest.mark.parametrize(
    ("level", "names"),
    [
        (None, ["same-host"]),  # host is the default
        ("rack", ["same-rack", "same-host"]),
        ("zone", ["same-zone", "same-rack", "same-host"]),
        ("region", ["same-region", "same-zone", "same-rack", "same-host"]),
    ],
)
def test_min_affinity_is_the_loosest_tier_that_passes(level: str | None, names: list[str]) -> None:
    assert kept(level, CANDIDATES, DECODE) == names


def test_fails_open_without_a_peer_or_when_no_candidate_is_close() -> None:
    every = [e.name for e in CANDIDATES]
    assert kept("host", CANDIDATES, None) == every
    assert kept("host", CANDIDATES, pod("peer-without-topology", None)) == every
    assert kept("host", [FAR, UNKNOWN], DECODE) == ["far", "unknown"]


def test_an_empty_field_never_matches_an_empty_field() -> None:
    peer = pod("p", Topology(zone="z1"))
    no_host = pod("no-host", Topology(zone="z1"))
    assert kept("host", [no_host, FAR], peer) == ["no-host", "far"]  # none close: fail open
    assert kept("zone", [no_host, FAR], peer) == ["no-host"]


def test_topology_producer_name_selects_the_extractor_instance() -> None:
    peer = pod("p", Topology("h1"), producer="topo-b")
    near = pod("near", Topology("h1"), producer="topo-b")
    params = TopologyAffinityFilterParams.model_validate({"topologyProducerName": "topo-b"})
    flt = TopologyAffinityFilter("t", params, ledger())
    state = CycleState({PEER_ENDPOINT_KEY: peer})
    assert [e.name for e in flt.filter(state, req(), [FAR, near])] == ["near"]


def test_min_affinity_must_be_a_tier() -> None:
    with pytest.raises(ValidationError):
        TopologyAffinityFilterParams.model_validate({"minAffinity": "datacenter"})
