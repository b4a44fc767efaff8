"""One config's routing: the pool, the plugins and everything built from them.

The gateway holds one `Routing` at a time and swaps it on a reload (server/reload.py). A
request takes the current one when it arrives and keeps it to the end, so a reload never
changes the plugins under a request in flight; a retired routing stops its plugins and its
scraping only once its last request has finished."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import aiohttp
from prometheus_client.registry import Collector

from heimdall_proxy.config.build import PluginSet, build_plugins
from heimdall_proxy.config.flow_build import build_flow
from heimdall_proxy.config.gateway import ConfigError, EndpointConfig, GatewayConfig, PluginConfig
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.datalayer.kubernetes import (
    DiscoveryUnavailableError,
    KubernetesPods,
    check_available,
)
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.datalayer.refresher import PoolRefresher, RefreshOptions
from heimdall_proxy.datalayer.vllm_metrics import needed_families, stand_ins
from heimdall_proxy.flowcontrol.controller import FlowController
from heimdall_proxy.flowcontrol.metrics import FlowMetrics
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import InFlightLoad, LoadEstimator
from heimdall_proxy.framework.inherit import inherit_state
from heimdall_proxy.framework.popularity import Popularities
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.observability.metrics import GatewayMetrics
from heimdall_proxy.resilience.outliers import OutlierDetector
from heimdall_proxy.server.director import Director
from heimdall_proxy.server.headers import UpstreamCredentials
from heimdall_proxy.server.hooks import Hooks
from heimdall_proxy.server.hops import Hops
from heimdall_proxy.server.relay import Relay
from heimdall_proxy.upstream import UpstreamClient, UpstreamTimeouts

log = logging.getLogger(__name__)


class Routing:
    """Built synchronously from a config (so every config error surfaces before anything is
    swapped or a port is bound); `start` opens its network work, `stop` closes it."""

    def __init__(
        self,
        config: GatewayConfig,
        options: ServerOptions,
        registry: Registry,
        metrics: GatewayMetrics,
        flow_metrics: FlowMetrics,
        load: InFlightLoad,
        previous: Routing | None = None,
    ) -> None:
        self.config = config
        self.options = options
        self.metrics = metrics
        if config.discovery.kubernetes is not None:
            try:
                check_available()
            except DiscoveryUnavailableError as exc:
                raise ConfigError(f"{config.source}: {exc}") from None
        self.pool: EndpointPool = EndpointPool(
            config.endpoints, previous.pool if previous is not None else None
        )
        # The in-flight ledger outlives a reload: requests still running on the old plugins
        # count against their pods for the new saturation detector too.
        # So does the prefix popularity (its counts are the fleet's recent requests).
        self.popularity: Popularities = (
            previous.popularity if previous is not None else Popularities()
        )
        handle = PluginHandle(
            pool=self.pool,
            feature_gates=frozenset(config.epp.feature_gates),
            load=load,
            popularity=self.popularity,
            kubernetes=config.discovery.kubernetes is not None,
        )
        extra = [PluginConfig(type="response-header-handler")] if options.response_header else []
        self.plugins: PluginSet = build_plugins(
            config.epp, registry, handle, metrics.plugin_timer, extra
        )
        #: Plugins that took over the learned state of the ones of the replaced config.
        self.inherited: list[str] = []
        self.outliers = OutlierDetector(
            config.outlier_detection, lambda pod: metrics.ejections.labels(pod).inc()
        )
        self.load = load
        #: What an attempt adds to the ledger: the config's inflight-load-producer says.
        estimators = [p for p in self.plugins.plugins.values() if isinstance(p, LoadEstimator)]
        if len(estimators) > 1:
            raise ConfigError(
                f"{config.source}: more than one inflight-load-producer: the gateway keeps one "
                "in-flight ledger"
            )
        self.load_estimate = estimators[0].estimate_load if estimators else None
        self.flow: FlowController = build_flow(config, self.plugins, registry, handle, flow_metrics)
        self.director = Director(
            self.pool, self.plugins, metrics, options.trust_client_transfer_params,
            self.outliers, self.flow, options.max_attempts,
        )  # fmt: skip
        self.hooks = Hooks(self.plugins)
        self.relay: Relay | None = None
        self.refresher: PoolRefresher | None = None
        self.discovery: KubernetesPods | None = None
        self._collectors: list[Collector] = []
        self._started: list[object] = []
        #: Requests that took this routing and have not finished.
        self.in_flight = 0
        #: Set once a reload replaced it; only then is its idleness signalled.
        self.retired = False
        self._idle = asyncio.Event()

    def inherit(self, previous: Routing) -> None:
        """Take over what the replaced routing's plugins learned (framework.inherit). Called
        once this routing has started, right before it takes new requests: from then on
        nothing can fail the reload, so the hand-over is never undone."""
        gone = frozenset(
            e.name
            for e in previous.pool.endpoints()
            if (now := self.pool.get(e.name)) is None or now.url != e.url
        )
        self.inherited = inherit_state(previous.plugins.plugins, self.plugins.plugins, gone)
        self.load.forget(gone)

    def leave(self) -> None:
        """A request that took this routing (and counted itself in `in_flight`) is over."""
        self.in_flight -= 1
        if self.in_flight == 0 and self.retired:
            self._idle.set()

    async def start(
        self,
        upstream: UpstreamClient,
        data_session: aiohttp.ClientSession,
        timeouts: Mapping[bool, UpstreamTimeouts],
    ) -> None:
        """Scrape every pod once (bounded by the start-up timeout), then start the scraping
        loops and the plugins' background work. On failure what was started is stopped."""
        opts = self.options
        hops = Hops(upstream, self.metrics, opts.max_attempts, self.load)
        credentials = UpstreamCredentials(
            bool(opts.api_keys or opts.admin_api_keys), opts.upstream_api_key
        )
        self.relay = self.director.relay = Relay(
            upstream, self.hooks, hops, self.metrics, self.outliers, timeouts, self.load,
            credentials, self.load_estimate,
        )  # fmt: skip
        self.refresher = PoolRefresher(
            self.pool,
            data_session,
            RefreshOptions(
                opts.metrics_interval,
                opts.metrics_timeout,
                opts.models_interval,
                health_interval=opts.health_interval,
                health_timeout=opts.health_timeout,
                idle_metrics_interval=opts.idle_metrics_interval,
                families=needed_families(self.plugins.plugins.values()),
                stand_ins=stand_ins(self.plugins.plugins.values()),
            ),
            self.plugins.data_sources,
            self.load,
        )
        try:
            k8s = self.config.discovery.kubernetes
            if k8s is not None:
                self.discovery = KubernetesPods(k8s, self._discovered)
                await self.discovery.start()
            try:
                await asyncio.wait_for(self.refresher.refresh_once(), opts.startup_timeout)
            except TimeoutError:
                log.warning("not every pod answered within %.1fs of start-up", opts.startup_timeout)
            self.refresher.start()
            for plugin in self.plugins.lifecycle:
                await plugin.start()
                self._started.append(plugin)
        except BaseException:
            await self.stop()
            raise

    def _discovered(self, pods: list[EndpointConfig]) -> None:
        """A discovery source's new pod set: the pool becomes the static endpoints plus these
        (a static endpoint wins a name both have), and scraping follows."""
        static = self.config.endpoints
        names = {e.name for e in static}
        clash = sorted(p.name for p in pods if p.name in names)
        if clash:
            log.warning("discovered pods %s share a name with static endpoints: ignored", clash)
        before = {e.name for e in self.pool.endpoints()}
        self.pool.replace(static + [p for p in pods if p.name not in names])
        self.load.forget(before - {e.name for e in self.pool.endpoints()})
        if self.refresher is not None and self.refresher.running:
            self.refresher.sync()

    def publish(self) -> None:
        """Expose this routing's pool and plugin metrics on /metrics."""
        self.metrics.use_pool(self.pool)
        self._collectors = self.metrics.add_sources(self.plugins.plugins.values())

    def unpublish(self) -> None:
        self.metrics.remove_sources(self._collectors)
        self._collectors = []

    async def drained(self) -> None:
        """Mark this routing retired (new requests take another) and return once no request
        uses it."""
        self.retired = True
        if self.in_flight == 0:
            return
        await self._idle.wait()

    async def stop(self) -> None:
        for plugin in reversed(self.plugins.lifecycle):
            if plugin in self._started:
                try:
                    await plugin.stop()
                except Exception:
                    log.exception("plugin %r failed to stop", plugin)
        self._started = []
        await self.flow.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        if self.refresher is not None:
            await self.refresher.stop()
