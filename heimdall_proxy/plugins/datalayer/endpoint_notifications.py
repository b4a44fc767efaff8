"""endpoint-notification-source (llm-d's): pods joining and leaving the pool, told to the
extractors that keep something per pod."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.plugins import ENDPOINT_EVENTS
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint

ENDPOINT_NOTIFICATION_SOURCE_TYPE = "endpoint-notification-source"


@register(ENDPOINT_NOTIFICATION_SOURCE_TYPE, NoParams)
class EndpointNotificationSource(BasePlugin[NoParams]):
    """Not polled: whenever the pool changes (start-up, a reload, a discovery update, static
    endpoints or Kubernetes alike), each extractor wired to it in `dataLayer.sources` is
    told of every pod that joined or changed and every pod that left
    (`endpoint_changed(endpoint, removed)`), so it drops what it keeps about a departed pod
    at once rather than on its next sweep (mm-embeddings-cache-producer), or follows a new
    pod's KV events at once (precise-prefix-cache-producer). The extractors must be
    endpoint extractors; the config is refused otherwise."""

    type = ENDPOINT_NOTIFICATION_SOURCE_TYPE
    output_type = ENDPOINT_EVENTS

    async def collect(self, endpoint: Endpoint, session: object) -> object:
        """Not called: the data layer delivers the pool's changes (see the class docstring)."""
        raise NotImplementedError("endpoint-notification-source is not polled")
