"""Kubernetes pod discovery: the pods an InferencePool would select, followed by list + watch.

The loop is client-go's reflector in small: list the matching pods (that gives the resource
version), watch from that version, apply ADDED / MODIFIED / DELETED, reopen the watch from the
last version seen when it ends; when the API server answers 410 Gone (the version is too old
to watch from) or fails, list again, which replaces the whole set. A pod is an endpoint while
it is Running, Ready, has an IP and is not being deleted (GIE's EPP counts only ready pods).

Uses kubernetes_asyncio (the `kubernetes` extra); it is imported only when discovery is on."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from collections.abc import Callable, Mapping
from typing import Any

from heimdall_proxy.config.discovery import KubernetesDiscoveryConfig
from heimdall_proxy.config.gateway import EndpointConfig

log = logging.getLogger(__name__)

#: Receives the full set of ready pods after every change.
OnChange = Callable[[list[EndpointConfig]], None]


MISSING = "discovery.kubernetes needs kubernetes_asyncio: pip install 'heimdall-proxy[kubernetes]'"


def check_available() -> None:
    """Raise DiscoveryUnavailableError when the client library is not installed (called when
    the config is built, so the error comes before a port is bound)."""
    if importlib.util.find_spec("kubernetes_asyncio") is None:
        raise DiscoveryUnavailableError(MISSING)


class DiscoveryUnavailableError(RuntimeError):
    """The Kubernetes client library is not installed, or no credentials were found."""


def pod_endpoint(pod: Mapping[str, Any], cfg: KubernetesDiscoveryConfig) -> EndpointConfig | None:
    """The endpoint of a pod (a Pod object as the API returns it), or None while it is not
    serving: not Running, not Ready, without an IP, or terminating."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return None
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    ip = status.get("podIP")
    if not ready or not ip or not meta.get("name"):
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return EndpointConfig(
        name=meta["name"],
        url=f"{cfg.scheme}://{host}:{cfg.target_port}",
        labels=meta.get("labels") or {},
    )


class _Gone(Exception):
    """The watch's resource version expired (HTTP 410): list again."""


class KubernetesPods:
    """Follows the pods matching `cfg` and reports the ready set to `on_change`."""

    def __init__(self, cfg: KubernetesDiscoveryConfig, on_change: OnChange) -> None:
        self.cfg = cfg
        self.on_change = on_change
        self._pods: dict[str, EndpointConfig] = {}
        self._api: Any = None
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        #: Lists made (the first one and each resync), for logs and tests.
        self.lists = 0

    async def start(self) -> None:
        """Connect, list once (so the gateway starts with the pods), then watch in the
        background. Raises DiscoveryUnavailableError, or the API's error of the first list."""
        self._api, self._client = await _connect(self.cfg)
        try:
            version = await self._list()
        except BaseException:
            await self._client.close()
            raise
        self._task = asyncio.create_task(self._run(version), name="kubernetes-pods")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _publish(self) -> None:
        self.on_change(sorted(self._pods.values(), key=lambda e: e.name))

    def _call_kwargs(self) -> dict[str, Any]:
        return {"label_selector": self.cfg.label_selector()}

    def _lister(self) -> Any:
        if self.cfg.namespace:
            return lambda **kw: self._api.list_namespaced_pod(self.cfg.namespace, **kw)
        return self._api.list_pod_for_all_namespaces

    async def _list(self) -> str:
        resp = await self._lister()(**self._call_kwargs(), _preload_content=False)
        doc = await resp.json()
        pods: dict[str, EndpointConfig] = {}
        for pod in doc.get("items") or ():
            endpoint = pod_endpoint(pod, self.cfg)
            if endpoint is not None:
                pods[endpoint.name] = endpoint
        self._pods = pods
        self.lists += 1
        log.info("kubernetes: %d ready pods match %s", len(pods), self.cfg.label_selector())
        self._publish()
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def _run(self, version: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        while True:
            try:
                version = await self._watch(version)
                continue
            except _Gone:
                log.info("kubernetes: watch expired (410 Gone); listing the pods again")
            except (ApiException, OSError, ValueError) as exc:
                log.warning("kubernetes: pod watch failed (%s); listing again", exc)
                await asyncio.sleep(self.cfg.retry_delay)
            except Exception as exc:  # aiohttp's errors, a malformed event
                log.warning("kubernetes: pod watch failed (%r); listing again", exc)
                await asyncio.sleep(self.cfg.retry_delay)
            while True:
                try:
                    version = await self._list()
                    break
                except Exception as exc:
                    log.warning("kubernetes: listing pods failed (%r)", exc)
                    await asyncio.sleep(self.cfg.retry_delay)

    async def _watch(self, version: str) -> str:
        """Apply one watch stream's events; returns the version to watch from next."""
        from kubernetes_asyncio import watch
        from kubernetes_asyncio.client.exceptions import ApiException

        w = watch.Watch()
        try:
            stream = w.stream(
                self._lister(),
                **self._call_kwargs(),
                resource_version=version,
                timeout_seconds=max(1, int(self.cfg.watch_timeout)),
                allow_watch_bookmarks=True,
            )
            async with stream:
                async for event in stream:
                    self._apply(event["type"], event["raw_object"])
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone from exc
            raise
        return str(w.resource_version or version)

    def _apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        name = (pod.get("metadata") or {}).get("name")
        if kind == "BOOKMARK" or not name:
            return
        endpoint = pod_endpoint(pod, self.cfg) if kind != "DELETED" else None
        before = self._pods.get(name)
        if endpoint is None:
            self._pods.pop(name, None)
        else:
            self._pods[name] = endpoint
        if before != endpoint:
            log.info(
                "kubernetes: pod %s %s",
                name,
                "ready at " + endpoint.url if endpoint is not None else "left the pool",
            )
            self._publish()


async def _connect(cfg: KubernetesDiscoveryConfig) -> tuple[Any, Any]:
    """A CoreV1Api and its ApiClient: from `kubeconfig` when given, else the in-cluster
    service account, else ~/.kube/config."""
    try:
        from kubernetes_asyncio import client, config
    except ImportError as exc:
        raise DiscoveryUnavailableError(MISSING) from exc
    configuration = client.Configuration()
    try:
        if cfg.kubeconfig:
            await config.load_kube_config(
                config_file=cfg.kubeconfig, context=cfg.context, client_configuration=configuration
            )
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                await config.load_kube_config(
                    context=cfg.context, client_configuration=configuration
                )
    except (config.ConfigException, OSError) as exc:
        raise DiscoveryUnavailableError(f"discovery.kubernetes: no credentials: {exc}") from exc
    api_client = client.ApiClient(configuration)
    return client.CoreV1Api(api_client), api_client
