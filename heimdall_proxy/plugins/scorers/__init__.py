from heimdall_proxy.plugins.scorers import (
    active_request,
    context_length,
    kv_cache_utilization,
    load_aware,
    lora_affinity,
    no_hit_lru,
    outstanding_work,
    precise_prefix_cache,
    prefix_cache,
    queue,
    running_requests,
    session_affinity,
)

__all__ = [
    "active_request",
    "context_length",
    "kv_cache_utilization",
    "load_aware",
    "lora_affinity",
    "no_hit_lru",
    "outstanding_work",
    "precise_prefix_cache",
    "prefix_cache",
    "queue",
    "running_requests",
    "session_affinity",
]
