from heimdall_proxy.plugins.profiles import disagg, single

__all__ = ["disagg", "single"]
