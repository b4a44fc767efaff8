"""topology-extractor: a pod's Topology from its labels, stamped once per Endpoint."""

from __future__ import annotations

from heimdall_proxy.framework.topology import Topology, read_topology, topology_key
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.datalayer.topology import TopologyExtractor, TopologyExtractorParams
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

LABELS = {
    "kubernetes.io/hostname": "node-1",
    "topology.kubernetes.io/rack": "r1",
    "topology.kubernetes.io/zone": "z1",
    "topology.kubernetes.io/region": "eu",
}


def extractor(name: str = "topology-extractor", **params: str) -> TopologyExtractor:
    return TopologyExtractor(name, TopologyExtractorParams.model_validate(params), ledger())


async def test_default_labels_are_the_kubernetes_topology_labels() -> None:
    pods = [ep("a", LABELS), ep("b", {"topology.kubernetes.io/zone": "z2"}), ep("c")]
    await extractor().produce(CycleState(), req(), pods)
    key = topology_key()
    assert read_topology(pods[0], key) == Topology("node-1", "r1", "z1", "eu")
    assert read_topology(pods[1], key) == Topology(zone="z2")
    assert read_topology(pods[2], key) is None  # labels say nothing: nothing published


async def test_configured_labels_and_empty_means_default() -> None:
    ext = extractor("topo", hostname="gpu/host", rack="", zone="my/zone")
    pod = ep("a", {"gpu/host": "h9", "topology.kubernetes.io/rack": "r3", "my/zone": "z9"})
    await ext.produce(CycleState(), req(), [pod])
    assert read_topology(pod, topology_key("topo")) == Topology("h9", "r3", "z9", "")
    assert read_topology(pod, topology_key()) is None  # published under its own name


async def test_an_endpoint_is_stamped_once() -> None:
    ext = extractor()
    pod = ep("a", dict(LABELS))
    await ext.produce(CycleState(), req(), [pod])
    pod.labels["kubernetes.io/hostname"] = (
        "elsewhere"  # never done: a new label set is a new Endpoint
    )
    await ext.produce(CycleState(), req(), [pod])
    assert read_topology(pod, topology_key()) == Topology("node-1", "r1", "z1", "eu")
