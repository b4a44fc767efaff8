"""dcgm-extractor (llm-d's): a pod's GPU utilization from its DCGM exporter's page."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.attributes import publish_attribute
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.plugins import PROMETHEUS_DATA
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint

DCGM_EXTRACTOR_TYPE = "dcgm-extractor"
GPU_UTIL_FAMILY = "DCGM_FI_DEV_GPU_UTIL"
#: The attribute it publishes, under its type as producer (llm-d's data key).
GPU_UTILIZATION = "GPUUtilization"


@register(DCGM_EXTRACTOR_TYPE, NoParams)
class DcgmExtractor(BasePlugin[NoParams]):
    """Publishes the endpoint attribute ("GPUUtilization", "dcgm-extractor"), in [0, 1]: the
    highest `DCGM_FI_DEV_GPU_UTIL` (0-100) among the pod's GPUs, divided by 100, for
    endpoint-attribute-filter / -scorer with `producer: dcgm-extractor`.

    A page that labels its samples with `pod` (an exporter shared by several pods) counts
    only the samples of this pod's name; samples without the label all count (an exporter
    beside the pod). A page without the family, or without a sample of this pod, is a
    failed extraction: the value published last stays."""

    type = DCGM_EXTRACTOR_TYPE
    input_type = PROMETHEUS_DATA
    metric_families = frozenset({GPU_UTIL_FAMILY})

    def extract(self, endpoint: Endpoint, data: object) -> None:
        samples = data.get(GPU_UTIL_FAMILY) if isinstance(data, Mapping) else None
        if not samples:
            raise ValueError(f"metric {GPU_UTIL_FAMILY!r} not found on the DCGM page")
        values = [value for labels, value in samples if _of_pod(labels, endpoint.name)]
        if not values:
            raise ValueError(f"{GPU_UTIL_FAMILY!r} has no sample of pod {endpoint.name!r}")
        publish_attribute(endpoint, GPU_UTILIZATION, self.type, max(values) / 100.0)


def _of_pod(labels: dict[str, str], pod: str) -> bool:
    owner = labels.get("pod")
    return owner is None or owner == pod
