from heimdall_proxy.plugins.requestcontrol import disagg_headers, response_header

__all__ = ["disagg_headers", "response_header"]
