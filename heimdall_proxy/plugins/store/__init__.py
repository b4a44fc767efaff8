from heimdall_proxy.plugins.store import responses_store

__all__ = ["responses_store"]
