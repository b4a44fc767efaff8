"""dcgm-data-source (llm-d's): an NVIDIA DCGM exporter's metrics page beside each pod."""

from __future__ import annotations

import aiohttp
from pydantic import Field, model_validator

from heimdall_proxy.datalayer.refresher import fetch_families
from heimdall_proxy.datalayer.scan import Sample
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.plugins import PROMETHEUS_DATA
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.plugins.datalayer.http_source import HttpSourceParams, page_url, tls_context

DCGM_DATA_SOURCE_TYPE = "dcgm-data-source"
#: Where a DCGM exporter listens unless told otherwise.
DCGM_PORT = 9400
#: How long one read of the page may take.
DCGM_TIMEOUT = 1.0


class DcgmSourceParams(HttpSourceParams):
    port: int | None = Field(default=DCGM_PORT, ge=1, le=65535)
    #: llm-d: scrape the node's address (a DaemonSet exporter) instead of the pod's.
    use_node_address: bool = False

    @model_validator(mode="after")
    def _node_address(self) -> DcgmSourceParams:
        if self.use_node_address:
            raise ValueError(
                "useNodeAddress: true scrapes the exporter on the pod's node, but endpoints "
                "here carry no node address (neither static endpoints nor the Kubernetes "
                "discovery record one); run the DCGM exporter beside each pod (a sidecar) "
                "and leave useNodeAddress false"
            )
        return self


@register(DCGM_DATA_SOURCE_TYPE, DcgmSourceParams)
class DcgmDataSource(BasePlugin[DcgmSourceParams]):
    """Reads `{scheme}://{pod host}:{port}{path}` (default `http://<pod>:9400/metrics`) of
    every pod on its own `interval` (default: the data layer's metrics interval), with the
    data layer's scrape (datalayer/refresher.py `fetch_families`): only the families its
    extractors read are parsed (dcgm-extractor: `DCGM_FI_DEV_GPU_UTIL`). A failed read keeps
    the values published last."""

    type = DCGM_DATA_SOURCE_TYPE
    output_type = PROMETHEUS_DATA

    def __init__(self, name: str, params: DcgmSourceParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.interval = params.interval
        self.ssl = tls_context(params)
        #: The families the wired extractors read (config/build.py adds theirs).
        self.families: frozenset[str] = frozenset()

    def wants(self, families: frozenset[str]) -> None:
        self.families |= families

    def url(self, endpoint: Endpoint) -> str:
        return page_url(endpoint, self.params)

    async def collect(
        self, endpoint: Endpoint, session: aiohttp.ClientSession
    ) -> dict[str, list[Sample]]:
        return await fetch_families(
            session, self.url(endpoint), self.families, DCGM_TIMEOUT, self.ssl
        )
