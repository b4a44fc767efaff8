"""inflight-load-producer (llm-d's): says what each request adds to the gateway's in-flight
ledger, which token-load-scorer, active-request-scorer and the concurrency detector read."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client import Metric
from prometheus_client.core import GaugeMetricFamily
from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import (
    DEFAULT_OUTPUT_RATIO,
    LoadEstimate,
)
from heimdall_proxy.framework.prefix import prefix_match_reader
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import RequestContext
from heimdall_proxy.plugins.scheduling.scorers.shared_state import (
    SharedCountsParams,
    SharesState,
    ledger_store,
)

INFLIGHT_LOAD_PRODUCER_TYPE = "inflight-load-producer"

log = logging.getLogger(__name__)


class InFlightLoadProducerParams(SharedCountsParams):
    add_estimated_output_tokens: bool = False
    output_ratio: float = Field(default=DEFAULT_OUTPUT_RATIO, ge=0.0)
    max_estimated_output_tokens: int | None = Field(default=None, ge=0)
    #: The prefix producer whose match discounts the cached part of a prompt, whatever its
    #: kind; empty: the default approx-prefix-cache-producer's.
    prefix_match_info_producer_name: str = ""
    #: llm-d's: share the ledger with the other gateway replicas when a store is configured
    #: (here `redisConfig` / `valkeyConfig` on this plugin, an extension: llm-d names a
    #: cross-replica syncer plugin in its data layer config instead); false keeps it local,
    #: whatever store another plugin names.
    sync_cross_replica_state: bool = True


@register(INFLIGHT_LOAD_PRODUCER_TYPE, InFlightLoadProducerParams)
class InFlightLoadProducer(SharesState, BasePlugin[InFlightLoadProducerParams]):
    """The tokens an attempt puts on its pod in the gateway's one in-flight ledger
    (framework/inflight.py): the prompt tokens the pod does not already hold (by the prefix
    match of `prefixMatchInfoProducerName`; the whole prompt when none ran), released at a
    stream's first chunk (prefill is over) or at the end; with `addEstimatedOutputTokens`,
    plus `outputRatio` x the prompt's length, capped by the request's max tokens and
    `maxEstimatedOutputTokens`, released at the end. The request itself counts from dispatch
    to its end.

    The ledger is the gateway's, not this plugin's: there is one per process whatever the
    config declares, it outlives reloads, and pods that leave the pool are forgotten.
    Without this plugin the ledger counts with its defaults (prompt tokens, no output).

    Replica sharing (`redisConfig` / `valkeyConfig`, `syncInterval`, `replicaTTL`; ours, on
    the counters of heimdall_proxy.replicas): the ledger's per-pod totals (requests, tokens,
    whole prompts and the values plugins keep in it) are published once per gateway, and
    every reader counts every live replica's (replicas/ledger.py); a replica silent for
    `replicaTTL` no longer counts. `syncCrossReplicaState: false` (llm-d's) keeps the
    ledger local, even when a scorer names a store of its own."""

    type = INFLIGHT_LOAD_PRODUCER_TYPE

    def __init__(self, name: str, params: InFlightLoadProducerParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        # whichever kind of prefix producer has that name (and wherever in the plugin list:
        # the match is looked up per request)
        self._estimate = LoadEstimate(
            prefix_match_reader(params.prefix_match_info_producer_name),
            params.add_estimated_output_tokens,
            params.output_ratio,
            params.max_estimated_output_tokens,
        )
        handle.load.count_tokens = True
        self.load = handle.load
        self.pool = handle.pool
        store = ledger_store(self, params)
        if params.sync_cross_replica_state:
            self.ledger_store = store
            self.ledger_rank = 0 if store is not None else 1
        else:
            if store is not None:
                log.warning(
                    "plugin %r (type %r): redisConfig is not used: syncCrossReplicaState is "
                    "false, the in-flight ledger stays local",
                    name,
                    self.type,
                )
            self.ledger_rank = 0  # holds the ledger local

    def collect_metrics(self) -> Iterable[Metric]:
        """llm-d's gauges: `llm_d_epp_inflight_requests` and `llm_d_epp_inflight_tokens` per
        pod of the pool, this replica's own (Prometheus sums the replicas; with the ledger
        shared, the readers' counts are the sum). The ledger counts per pod only, so
        `fairness_id` and `priority` are empty (llm-d splits them by flow); `namespace` is
        the pod's when discovery gave one."""
        labels = ["endpoint_name", "namespace", "producer_name", "fairness_id", "priority"]
        requests = GaugeMetricFamily(
            "llm_d_epp_inflight_requests",
            "Current number of in-flight requests per endpoint, as tracked by the in-flight "
            "load producer.",
            labels=labels,
        )
        tokens = GaugeMetricFamily(
            "llm_d_epp_inflight_tokens",
            "Current number of in-flight tokens per endpoint (uncached prompt tokens, "
            "optionally plus estimated output), as tracked by the in-flight load producer.",
            labels=labels,
        )
        own_requests, own_tokens = self.load.own_requests, self.load.own_tokens
        for e in self.pool.endpoints() if self.pool is not None else ():
            values = [e.name, getattr(e, "namespace", "") or "", self.name, "", ""]
            requests.add_metric(values, own_requests.get(e.name, 0))
            tokens.add_metric(values, own_tokens.get(e.name, 0))
        yield requests
        yield tokens

    def estimate_load(self, ctx: RequestContext) -> tuple[int, int, int]:
        return self._estimate(ctx)
