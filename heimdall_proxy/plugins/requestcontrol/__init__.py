from heimdall_proxy.plugins.requestcontrol import response_header

__all__ = ["response_header"]
