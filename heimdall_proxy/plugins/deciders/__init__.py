from heimdall_proxy.plugins.deciders import always, prefix_based

__all__ = ["always", "prefix_based"]
