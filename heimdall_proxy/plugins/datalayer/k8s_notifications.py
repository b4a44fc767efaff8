"""k8s-notification-source (llm-d's): a watch of one Kubernetes kind, for extractors that
react to its objects."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint

K8S_NOTIFICATION_SOURCE_TYPE = "k8s-notification-source"
#: What its extractors read: add/update/delete events of the watched kind's objects.
K8S_NOTIFICATIONS = "k8s-notifications"


class K8sNotificationParams(PluginParams):
    group: str = ""
    version: str
    kind: str


@register(K8S_NOTIFICATION_SOURCE_TYPE, K8sNotificationParams)
class K8sNotificationSource(BasePlugin[K8sNotificationParams]):
    """Watches one group/version/kind in the cluster and hands its objects' add, update and
    delete events to notification extractors. It needs a cluster: without
    `discovery.kubernetes` the config is refused, saying so, and pointing at
    endpoint-notification-source for the pool's own changes. With it, the source is accepted
    beside the discovery's watch of the pods; no built-in plugin is a notification extractor
    (llm-d has none either: they are users' own Go plugins), so the events have no reader
    and the data layer says the source is not used."""

    type = K8S_NOTIFICATION_SOURCE_TYPE
    output_type = K8S_NOTIFICATIONS

    def __init__(self, name: str, params: K8sNotificationParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        if not params.version or not params.kind:
            raise ValueError("version and kind are required for k8s-notification-source")
        if not handle.kubernetes:
            gvk = "/".join(p for p in (params.group, params.version, params.kind) if p)
            raise ValueError(
                f"k8s-notification-source watches Kubernetes objects ({gvk}) and needs a "
                "cluster, but the pods are not discovered from one (no discovery.kubernetes). "
                "Configure discovery.kubernetes, or, to react to pods joining and leaving the "
                "pool, use endpoint-notification-source instead"
            )

    async def collect(self, endpoint: Endpoint, session: object) -> object:
        raise NotImplementedError("k8s-notification-source is not polled")
