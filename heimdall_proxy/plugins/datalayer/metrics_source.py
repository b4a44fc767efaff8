"""metrics-data-source (llm-d's): the pods' Prometheus metrics page, which is the data layer's
own scrape here."""

from __future__ import annotations

import logging

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.plugins import PROMETHEUS_DATA
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.plugins.datalayer.http_source import HttpSourceParams, page_url, tls_context

log = logging.getLogger(__name__)

METRICS_DATA_SOURCE_TYPE = "metrics-data-source"


@register(METRICS_DATA_SOURCE_TYPE, HttpSourceParams)
class MetricsDataSource(BasePlugin[HttpSourceParams]):
    """The pods' metrics page (`{scheme}://{pod}:{port}{path}`, default
    `http://<pod>/metrics`). The gateway scrapes every pod's page whatever the config says
    (its queue, KV and pool gauges, the saturation detector and the scorers read it), so
    this source is not a second scraper: declaring it and wiring it in `dataLayer.sources`
    tells that scrape where the page is and how its certificate is checked, and every
    scrape's families are handed to the extractors wired to it (core-metrics-extractor,
    dcgm-extractor). Left out, llm-d adds it with core-metrics-extractor; here the scrape
    runs with the defaults.

    `interval` is not honoured: the scrape keeps the data layer's adaptive cadence (every
    `--metrics-interval` while a pod is busy, backing off to `--idle-metrics-interval`
    while it is quiet), which the routing decisions depend on; a warning says so."""

    type = METRICS_DATA_SOURCE_TYPE
    output_type = PROMETHEUS_DATA
    #: Read by the data layer: this source is its scrape, not a source polled apart.
    builtin_scrape = True

    def __init__(self, name: str, params: HttpSourceParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        if params.interval is not None:
            log.warning(
                "plugin %r: interval is not honoured: the pods' metrics are scraped on the "
                "data layer's own cadence (--metrics-interval, --idle-metrics-interval)",
                name,
            )
        self.ssl = tls_context(params)

    def url(self, endpoint: Endpoint) -> str:
        return page_url(endpoint, self.params)

    async def collect(self, endpoint: Endpoint, session: object) -> object:
        """Not called: the data layer's scrape reads the page (see the class docstring)."""
        raise NotImplementedError("metrics-data-source is read by the data layer's scrape")
