"""topology-extractor: publishes each pod's host, rack, zone and region, read from its
labels, for the topology-affinity filter and scorer."""

from __future__ import annotations

from pydantic import field_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.topology import TOPOLOGY_EXTRACTOR_TYPE, Topology, topology_key
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

#: The standard Kubernetes labels, llm-d's defaults.
DEFAULT_HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_RACK_LABEL = "topology.kubernetes.io/rack"
DEFAULT_ZONE_LABEL = "topology.kubernetes.io/zone"
DEFAULT_REGION_LABEL = "topology.kubernetes.io/region"


class TopologyExtractorParams(PluginParams):
    """Each field names the pod label its value is read from; empty means the default."""

    #: The label naming the pod's node (the NVLink domain of an HGX/DGX host).
    hostname: str = DEFAULT_HOSTNAME_LABEL
    #: The label naming its rack (on rack-scale NVLink, the NVLink domain).
    rack: str = DEFAULT_RACK_LABEL
    #: The label naming its zone.
    zone: str = DEFAULT_ZONE_LABEL
    #: The label naming its region.
    region: str = DEFAULT_REGION_LABEL

    @field_validator("hostname", "rack", "zone", "region", mode="before")
    @classmethod
    def _default_when_empty(cls, value: object, info: object) -> object:
        if value in ("", None):
            name = getattr(info, "field_name", "")
            return cls.model_fields[name].default
        return value


@register(TOPOLOGY_EXTRACTOR_TYPE, TopologyExtractorParams)
class TopologyExtractor(BasePlugin[TopologyExtractorParams]):
    """Stamps every pod with a Topology (under its own name as the producer, so several
    instances with different labels can coexist) from the configured labels. A pod none of
    whose labels is set gets no Topology: the affinity plugins then fail open.

    llm-d stamps a pod when the data layer first sees it (an endpoint event). Here a pod's
    labels are fixed for the life of its Endpoint object (the pool replaces the object when
    they change), so stamping a candidate the first time a request sees it, before the
    profiles run, gives the same attribute with no data source to wire: the extractor needs
    no `data.sources` entry, as llm-d's needs none in its configs.

    Not done: llm-d falls back to the Pod's `spec.hostname` when the hostname label is
    missing; the discovery here reads only the Pod's metadata, so such a pod has no
    hostname (it still matches on rack, zone or region)."""

    type = TOPOLOGY_EXTRACTOR_TYPE

    def __init__(self, name: str, params: TopologyExtractorParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.key = topology_key(name)
        self._labels = (params.hostname, params.rack, params.zone, params.region)

    def topology(self, endpoint: Endpoint) -> Topology | None:
        """What the pod's labels say, None when they say nothing."""
        labels = endpoint.labels
        host, rack, zone, region = (labels.get(label, "") for label in self._labels)
        if not (host or rack or zone or region):
            return None
        return Topology(hostname=host, rack=rack, zone=zone, region=region)

    def stamp(self, endpoint: Endpoint) -> None:
        """Publish the pod's Topology; None when its labels say nothing (readers take only a
        Topology, and the pod is not looked at again)."""
        endpoint.attributes[self.key] = self.topology(endpoint)

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        key = self.key
        for endpoint in endpoints:
            if key not in endpoint.attributes:
                self.stamp(endpoint)
