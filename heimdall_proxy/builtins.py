"""The composition root's list of built-in plugins: the one place that names them all.

The framework knows no plugin (an import-linter contract keeps it so); the CLI and the app
factory build their registry here."""

from __future__ import annotations

from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.plugins.admitters.latency_slo import LatencySLOAdmitter
from heimdall_proxy.plugins.datasources.models import ModelsDataSource, ModelServerProtocolModels
from heimdall_proxy.plugins.deciders.always import (
    AlwaysDisaggMultimodalDecider,
    AlwaysDisaggPDDecider,
)
from heimdall_proxy.plugins.deciders.prefix_based import PrefixBasedPDDecider
from heimdall_proxy.plugins.filters.by_label import ByLabelFilter
from heimdall_proxy.plugins.filters.by_label_selector import ByLabelSelectorFilter
from heimdall_proxy.plugins.filters.prefix_affinity import PrefixCacheAffinityFilter
from heimdall_proxy.plugins.filters.role import DecodeFilter, EncodeFilter, PrefillFilter
from heimdall_proxy.plugins.filters.slo_headroom_tier import SLOHeadroomTierFilter
from heimdall_proxy.plugins.flowcontrol.fcfs import FCFSOrdering
from heimdall_proxy.plugins.flowcontrol.global_strict import GlobalStrictFairness
from heimdall_proxy.plugins.flowcontrol.round_robin import RoundRobinFairness
from heimdall_proxy.plugins.pickers.max_score import MaxScorePicker
from heimdall_proxy.plugins.pickers.random_picker import RandomPicker
from heimdall_proxy.plugins.pickers.weighted_random import WeightedRandomPicker
from heimdall_proxy.plugins.prepare.tokenizer import TokenizerPlugin
from heimdall_proxy.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from heimdall_proxy.plugins.producers.inflight_load import InFlightLoadProducer
from heimdall_proxy.plugins.producers.precise_prefix import PrecisePrefixCacheProducer
from heimdall_proxy.plugins.producers.predicted_latency import PredictedLatencyProducer
from heimdall_proxy.plugins.producers.token import TokenProducer
from heimdall_proxy.plugins.profiles.disagg import DisaggProfileHandler, PDProfileHandler
from heimdall_proxy.plugins.profiles.single import SingleProfileHandler
from heimdall_proxy.plugins.requestcontrol.disagg_headers import DisaggHeadersHandler
from heimdall_proxy.plugins.requestcontrol.response_header import ResponseHeaderHandler
from heimdall_proxy.plugins.saturation.concurrency import ConcurrencyDetector
from heimdall_proxy.plugins.saturation.utilization import UtilizationDetector
from heimdall_proxy.plugins.scorers.active_request import ActiveRequestScorer
from heimdall_proxy.plugins.scorers.context_length import ContextLengthAware
from heimdall_proxy.plugins.scorers.kv_cache_utilization import KVCacheUtilizationScorer
from heimdall_proxy.plugins.scorers.latency import LatencyScorer
from heimdall_proxy.plugins.scorers.load_aware import LoadAwareScorer
from heimdall_proxy.plugins.scorers.lora_affinity import LoraAffinityScorer
from heimdall_proxy.plugins.scorers.no_hit_lru import NoHitLRUScorer
from heimdall_proxy.plugins.scorers.outstanding_work import OutstandingWorkScorer
from heimdall_proxy.plugins.scorers.precise_prefix_cache import PrecisePrefixCacheScorer
from heimdall_proxy.plugins.scorers.predicted_latency import PredictedLatencyScorer
from heimdall_proxy.plugins.scorers.prefix_cache import PrefixCacheScorer
from heimdall_proxy.plugins.scorers.queue import QueueScorer
from heimdall_proxy.plugins.scorers.running_requests import RunningRequestsSizeScorer
from heimdall_proxy.plugins.scorers.session_affinity import SessionAffinityScorer
from heimdall_proxy.plugins.scorers.token_load import TokenLoadScorer
from heimdall_proxy.plugins.store.responses_store import ResponsesStore

BUILTIN_PLUGINS: tuple[type, ...] = (
    # profile handlers and deciders
    SingleProfileHandler,
    DisaggProfileHandler,
    PDProfileHandler,
    AlwaysDisaggPDDecider,
    AlwaysDisaggMultimodalDecider,
    PrefixBasedPDDecider,
    # filters
    ByLabelFilter,
    ByLabelSelectorFilter,
    PrefixCacheAffinityFilter,
    PrefillFilter,
    DecodeFilter,
    EncodeFilter,
    # scorers
    ActiveRequestScorer,
    ContextLengthAware,
    KVCacheUtilizationScorer,
    LoadAwareScorer,
    LoraAffinityScorer,
    NoHitLRUScorer,
    OutstandingWorkScorer,
    PrecisePrefixCacheScorer,
    PrefixCacheScorer,
    QueueScorer,
    RunningRequestsSizeScorer,
    SessionAffinityScorer,
    TokenLoadScorer,
    # pickers
    MaxScorePicker,
    RandomPicker,
    WeightedRandomPicker,
    # prepare-data, producers, request control, data layer, store
    TokenizerPlugin,
    TokenProducer,
    InFlightLoadProducer,
    ApproxPrefixCacheProducer,
    PrecisePrefixCacheProducer,
    DisaggHeadersHandler,
    ResponseHeaderHandler,
    ModelsDataSource,
    ModelServerProtocolModels,
    ResponsesStore,
    # saturation detectors (also filters) and flow-control policies
    UtilizationDetector,
    ConcurrencyDetector,
    GlobalStrictFairness,
    RoundRobinFairness,
    FCFSOrdering,
    # latency-predicted scheduling and SLO admission
    PredictedLatencyProducer,
    LatencyScorer,
    PredictedLatencyScorer,
    SLOHeadroomTierFilter,
    LatencySLOAdmitter,
)


def load_builtin_plugins() -> Registry:
    """A new registry holding every built-in plugin type."""
    return Registry().add(*BUILTIN_PLUGINS)
