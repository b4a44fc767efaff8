from heimdall_proxy.plugins.profiles import single

__all__ = ["single"]
