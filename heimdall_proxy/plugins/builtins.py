"""The composition root's list of built-in plugins: the one place that names them all.

The framework knows no plugin (an import-linter contract keeps it so); the CLI and the app
factory build their registry here."""

from __future__ import annotations

from heimdall_proxy.framework.registry import Registry

# data layer, producers and reporting added from llm-d (issue 35)
from heimdall_proxy.plugins.datalayer.core_metrics import CoreMetricsExtractor
from heimdall_proxy.plugins.datalayer.dcgm_extractor import DcgmExtractor
from heimdall_proxy.plugins.datalayer.dcgm_source import DcgmDataSource
from heimdall_proxy.plugins.datalayer.endpoint_notifications import EndpointNotificationSource
from heimdall_proxy.plugins.datalayer.k8s_notifications import K8sNotificationSource
from heimdall_proxy.plugins.datalayer.metrics_source import MetricsDataSource
from heimdall_proxy.plugins.datalayer.models import ModelsDataSource, ModelServerProtocolModels
from heimdall_proxy.plugins.datalayer.refused import MockMetricsSource, MultiClusterType
from heimdall_proxy.plugins.datalayer.topology import TopologyExtractor
from heimdall_proxy.plugins.flowcontrol.edf import EDFOrdering
from heimdall_proxy.plugins.flowcontrol.fcfs import FCFSOrdering
from heimdall_proxy.plugins.flowcontrol.global_strict import GlobalStrictFairness
from heimdall_proxy.plugins.flowcontrol.program_aware import ProgramAwareFairness
from heimdall_proxy.plugins.flowcontrol.round_robin import RoundRobinFairness
from heimdall_proxy.plugins.flowcontrol.saturation.concurrency import ConcurrencyDetector
from heimdall_proxy.plugins.flowcontrol.saturation.utilization import UtilizationDetector
from heimdall_proxy.plugins.flowcontrol.slo_deadline import SLODeadlineOrdering
from heimdall_proxy.plugins.flowcontrol.usage_limits.priority_holdback import PriorityHoldback
from heimdall_proxy.plugins.flowcontrol.usage_limits.soft_reflective_ceiling import (
    SoftReflectiveCeiling,
)
from heimdall_proxy.plugins.flowcontrol.usage_limits.static import StaticUsageLimit
from heimdall_proxy.plugins.precise_prefix.producer import PrecisePrefixCacheProducer
from heimdall_proxy.plugins.precise_prefix.scorer import PrecisePrefixCacheScorer
from heimdall_proxy.plugins.predicted_latency.latency_scorer import LatencyScorer
from heimdall_proxy.plugins.predicted_latency.producer import PredictedLatencyProducer
from heimdall_proxy.plugins.predicted_latency.scorer import PredictedLatencyScorer
from heimdall_proxy.plugins.predicted_latency.slo_admitter import LatencySLOAdmitter
from heimdall_proxy.plugins.predicted_latency.slo_headroom_tier import SLOHeadroomTierFilter
from heimdall_proxy.plugins.prefix_affinity.filter import PrefixCacheAffinityFilter
from heimdall_proxy.plugins.requestcontrol.admitters.probabilistic import ProbabilisticAdmitter
from heimdall_proxy.plugins.requestcontrol.agent_identity import AgentIdentity
from heimdall_proxy.plugins.requestcontrol.attribute_reporter import RequestAttributeReporter
from heimdall_proxy.plugins.requestcontrol.disagg_headers import DisaggHeadersHandler
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import ApproxPrefixCacheProducer
from heimdall_proxy.plugins.requestcontrol.producers.burst_prefix import (
    BurstPrefixCacheProducer,
)
from heimdall_proxy.plugins.requestcontrol.producers.inflight_load import InFlightLoadProducer
from heimdall_proxy.plugins.requestcontrol.producers.mm_embeddings import (
    MMEmbeddingsCacheProducer,
)
from heimdall_proxy.plugins.requestcontrol.producers.session_id import SessionIDProducer
from heimdall_proxy.plugins.requestcontrol.producers.token import TokenProducer
from heimdall_proxy.plugins.requestcontrol.producers.tokenizer import TokenizerPlugin
from heimdall_proxy.plugins.requestcontrol.response_header import ResponseHeaderHandler
from heimdall_proxy.plugins.requesthandling.parsers.anthropic import AnthropicParser
from heimdall_proxy.plugins.requesthandling.parsers.openai import OpenAIParser
from heimdall_proxy.plugins.requesthandling.parsers.passthrough import PassthroughParser
from heimdall_proxy.plugins.requesthandling.parsers.sglanghttp import SGLangHttpParser
from heimdall_proxy.plugins.requesthandling.parsers.vllmhttp import VllmHttpParser
from heimdall_proxy.plugins.scheduling.deciders.always import (
    AlwaysDisaggMultimodalDecider,
    AlwaysDisaggPDDecider,
)
from heimdall_proxy.plugins.scheduling.deciders.prefix_based import PrefixBasedPDDecider
from heimdall_proxy.plugins.scheduling.filters.by_label import ByLabelFilter
from heimdall_proxy.plugins.scheduling.filters.by_label_selector import ByLabelSelectorFilter
from heimdall_proxy.plugins.scheduling.filters.endpoint_attribute import EndpointAttributeFilter
from heimdall_proxy.plugins.scheduling.filters.role import DecodeFilter, EncodeFilter, PrefillFilter
from heimdall_proxy.plugins.scheduling.filters.session_affinity import SessionAffinityFilter
from heimdall_proxy.plugins.scheduling.filters.topology_affinity import TopologyAffinityFilter
from heimdall_proxy.plugins.scheduling.filters.utilization import UtilizationFilter
from heimdall_proxy.plugins.scheduling.pickers.max_score import MaxScorePicker
from heimdall_proxy.plugins.scheduling.pickers.random_picker import RandomPicker
from heimdall_proxy.plugins.scheduling.pickers.weighted_random import WeightedRandomPicker
from heimdall_proxy.plugins.scheduling.profiles.data_parallel import DataParallelProfileHandler
from heimdall_proxy.plugins.scheduling.profiles.disagg import DisaggProfileHandler, PDProfileHandler
from heimdall_proxy.plugins.scheduling.profiles.header import HeaderProfileHandler
from heimdall_proxy.plugins.scheduling.profiles.single import SingleProfileHandler
from heimdall_proxy.plugins.scheduling.scorers.active_request import ActiveRequestScorer
from heimdall_proxy.plugins.scheduling.scorers.context_length import ContextLengthAware
from heimdall_proxy.plugins.scheduling.scorers.endpoint_attribute import EndpointAttributeScorer
from heimdall_proxy.plugins.scheduling.scorers.finish_time import FinishTimeScorer
from heimdall_proxy.plugins.scheduling.scorers.header_label_affinity import (
    HeaderLabelAffinityScorer,
)
from heimdall_proxy.plugins.scheduling.scorers.kv_cache_utilization import KVCacheUtilizationScorer
from heimdall_proxy.plugins.scheduling.scorers.load_aware import LoadAwareScorer
from heimdall_proxy.plugins.scheduling.scorers.lora_affinity import LoraAffinityScorer
from heimdall_proxy.plugins.scheduling.scorers.mm_embeddings_cache import (
    MMEmbeddingsCacheScorer,
)
from heimdall_proxy.plugins.scheduling.scorers.no_hit_lru import NoHitLRUScorer
from heimdall_proxy.plugins.scheduling.scorers.outstanding_work import OutstandingWorkScorer
from heimdall_proxy.plugins.scheduling.scorers.prefix_cache import PrefixCacheScorer
from heimdall_proxy.plugins.scheduling.scorers.queue import QueueScorer
from heimdall_proxy.plugins.scheduling.scorers.running_requests import RunningRequestsSizeScorer
from heimdall_proxy.plugins.scheduling.scorers.session_affinity import SessionAffinityScorer
from heimdall_proxy.plugins.scheduling.scorers.token_load import TokenLoadScorer
from heimdall_proxy.plugins.scheduling.scorers.topology_affinity import TopologyAffinityScorer
from heimdall_proxy.plugins.store.responses_store import ResponsesStore

BUILTIN_PLUGINS: tuple[type, ...] = (
    # parsers (requestHandler.parsers)
    OpenAIParser,
    AnthropicParser,
    VllmHttpParser,
    SGLangHttpParser,
    PassthroughParser,
    # profile handlers and deciders
    SingleProfileHandler,
    DisaggProfileHandler,
    PDProfileHandler,
    DataParallelProfileHandler,
    HeaderProfileHandler,
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
    SessionAffinityFilter,
    UtilizationFilter,
    TopologyAffinityFilter,
    EndpointAttributeFilter,
    # scorers
    ActiveRequestScorer,
    ContextLengthAware,
    KVCacheUtilizationScorer,
    LoadAwareScorer,
    LoraAffinityScorer,
    NoHitLRUScorer,
    OutstandingWorkScorer,
    FinishTimeScorer,
    PrecisePrefixCacheScorer,
    PrefixCacheScorer,
    QueueScorer,
    RunningRequestsSizeScorer,
    SessionAffinityScorer,
    TokenLoadScorer,
    HeaderLabelAffinityScorer,
    TopologyAffinityScorer,
    EndpointAttributeScorer,
    # pickers
    MaxScorePicker,
    RandomPicker,
    WeightedRandomPicker,
    # prepare-data, producers, request control, data layer, store
    TokenizerPlugin,
    TokenProducer,
    InFlightLoadProducer,
    ApproxPrefixCacheProducer,
    SessionIDProducer,
    PrecisePrefixCacheProducer,
    DisaggHeadersHandler,
    ResponseHeaderHandler,
    ModelsDataSource,
    ModelServerProtocolModels,
    TopologyExtractor,
    ResponsesStore,
    # saturation detectors (also filters) and flow-control policies
    UtilizationDetector,
    ConcurrencyDetector,
    GlobalStrictFairness,
    RoundRobinFairness,
    FCFSOrdering,
    # admission and flow control added from llm-d (issue 35)
    ProbabilisticAdmitter,
    AgentIdentity,
    EDFOrdering,
    SLODeadlineOrdering,
    ProgramAwareFairness,
    StaticUsageLimit,
    PriorityHoldback,
    SoftReflectiveCeiling,
    # latency-predicted scheduling and SLO admission
    PredictedLatencyProducer,
    LatencyScorer,
    PredictedLatencyScorer,
    SLOHeadroomTierFilter,
    LatencySLOAdmitter,
    # data layer, producers and reporting added from llm-d (issue 35)
    MetricsDataSource,
    CoreMetricsExtractor,
    DcgmDataSource,
    DcgmExtractor,
    EndpointNotificationSource,
    K8sNotificationSource,
    MockMetricsSource,
    MultiClusterType,
    BurstPrefixCacheProducer,
    MMEmbeddingsCacheProducer,
    MMEmbeddingsCacheScorer,
    RequestAttributeReporter,
)


def load_builtin_plugins() -> Registry:
    """A new registry holding every built-in plugin type."""
    return Registry().add(*BUILTIN_PLUGINS)


#: Where each type comes from, for the plugin reference: the seeds (Heimdall's plugin set,
#: the project's specification), llm-d's router (llm-d/llm-d-router), both, or neither (ours).
SEED_TYPES = frozenset(
    {
        "active-request-scorer",
        "always-disagg-multimodal-decider",
        "always-disagg-pd-decider",
        "by-label",
        "by-label-selector",
        "context-length-aware",
        "decode-filter",
        "disagg-headers-handler",
        "disagg-profile-handler",
        "encode-filter",
        "kv-cache-utilization-scorer",
        "latency-scorer",
        "latency-slo-admitter",
        "load-aware-scorer",
        "lora-affinity-scorer",
        "max-score-picker",
        "model-server-protocol-models",
        "models-data-source",
        "no-hit-lru-scorer",
        "pd-profile-handler",
        "precise-prefix-cache-scorer",
        "predicted-latency-producer",
        "predicted-latency-scorer",
        "prefill-filter",
        "prefill-header-handler",
        "prefix-based-pd-decider",
        "prefix-cache-affinity-filter",
        "prefix-cache-scorer",
        "queue-scorer",
        "random-picker",
        "response-header-handler",
        "responses-store",
        "running-requests-size-scorer",
        "session-affinity-scorer",
        "single-profile-handler",
        "slo-headroom-tier-filter",
        "tokenizer",
        "weighted-random-picker",
    }
)
LLMD_TYPES = frozenset(
    {
        "active-request-scorer",
        "agent-identity",
        "always-disagg-multimodal-decider",
        "always-disagg-pd-decider",
        "anthropic-parser",
        "approx-prefix-cache-producer",
        "burst-prefix-cache-producer",
        "by-label",
        "by-label-selector",
        "concurrency-detector",
        "context-length-aware",
        "core-metrics-extractor",
        "data-parallel-profile-handler",
        "dcgm-data-source",
        "dcgm-extractor",
        "decode-filter",
        "disagg-headers-handler",
        "disagg-profile-handler",
        "edf-ordering-policy",
        "encode-filter",
        "endpoint-attribute-filter",
        "endpoint-attribute-scorer",
        "endpoint-notification-source",
        "fcfs-ordering-policy",
        "global-strict-fairness-policy",
        "header-label-affinity-scorer",
        "header-profile-handler",
        "inflight-load-producer",
        "k8s-notification-source",
        "kv-cache-utilization-scorer",
        "label-selector-filter",
        "latency-scorer",
        "latency-slo-admitter",
        "load-aware-scorer",
        "lora-affinity-scorer",
        "max-score-picker",
        "metrics-data-source",
        "mm-embeddings-cache-producer",
        "mm-embeddings-cache-scorer",
        "models-data-extractor",
        "models-data-source",
        "multicluster-approx-prefix-cache-producer",
        "multicluster-file-discovery",
        "multicluster-kv-cache-utilization-scorer",
        "multicluster-metrics-data-source",
        "multicluster-metrics-extractor",
        "multicluster-prefix-cache-scorer",
        "multicluster-queue-scorer",
        "multicluster-session-affinity-filter",
        "no-hit-lru-scorer",
        "openai-parser",
        "passthrough-parser",
        "pd-profile-handler",
        "precise-prefix-cache-producer",
        "precise-prefix-cache-scorer",
        "predicted-latency-producer",
        "prefill-filter",
        "prefill-header-handler",
        "prefix-based-pd-decider",
        "prefix-cache-affinity-filter",
        "prefix-cache-scorer",
        "priority-holdback-policy",
        "probabilistic-admitter",
        "program-aware-fairness",
        "queue-scorer",
        "random-picker",
        "request-attribute-reporter",
        "round-robin-fairness-policy",
        "running-requests-size-scorer",
        "session-affinity-filter",
        "session-affinity-scorer",
        "session-id-producer",
        "sglanghttp-parser",
        "single-profile-handler",
        "slo-deadline-ordering-policy",
        "slo-headroom-tier-filter",
        "soft-reflective-ceiling-policy",
        "static-usage-limit-policy",
        "token-load-scorer",
        "token-producer",
        "tokenizer",
        "topology-affinity-filter",
        "topology-affinity-scorer",
        "topology-extractor",
        "utilization-detector",
        "utilization-filter",
        "vllmhttp-parser",
        "weighted-random-picker",
    }
)


def origin(type_name: str) -> str:
    """Where plugin type `type_name` comes from: "seed", "llm-d", "seed, llm-d" or "ours"."""
    sources = (("seed", SEED_TYPES), ("llm-d", LLMD_TYPES))
    return ", ".join(name for name, types in sources if type_name in types) or "ours"
