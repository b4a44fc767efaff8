from heimdall_proxy.plugins.datasources import models

__all__ = ["models"]
