from heimdall_proxy.plugins.scorers import kv_cache_utilization, queue, running_requests

__all__ = ["kv_cache_utilization", "queue", "running_requests"]
