"""What llm-d's HTTP data sources share (metrics-data-source, dcgm-data-source): where a
pod's page is (scheme, port, path), how its certificate is checked, and how often it is read.
Not a plugin: the base of those that are."""

from __future__ import annotations

import ssl
from typing import Literal

from pydantic import Field, model_validator

from heimdall_proxy.framework.params import Duration, PluginParams, RequestPath
from heimdall_proxy.framework.types import Endpoint


class HttpSourceParams(PluginParams):
    scheme: Literal["http", "https"] = "http"
    path: RequestPath = "/metrics"
    #: Unset: the pod's own port.
    port: int | None = Field(default=None, ge=1, le=65535)
    insecure_skip_verify: bool = True
    #: PEM CA bundle that verifies the page's certificate (https).
    ca_cert_path: str = ""
    #: Client certificate and key for mutual TLS; both or neither.
    client_cert_path: str = ""
    client_key_path: str = ""
    #: Read period; unset: the data layer's metrics interval.
    interval: Duration | None = None

    @model_validator(mode="after")
    def _client_pair(self) -> HttpSourceParams:
        if bool(self.client_cert_path) != bool(self.client_key_path):
            raise ValueError("clientCertPath and clientKeyPath must be set together")
        if self.interval is not None and self.interval <= 0:
            raise ValueError("interval must be positive")
        return self


def tls_context(params: HttpSourceParams) -> ssl.SSLContext | bool:
    """What aiohttp is given as `ssl=` for this source: False skips verification (and then
    a CA bundle is not read), True the system's defaults, else a context with the CA bundle
    and client certificate configured. Raises OSError or ssl.SSLError on an unreadable
    file, at load."""
    if not (params.ca_cert_path or params.client_cert_path):
        return not params.insecure_skip_verify
    ctx = ssl.create_default_context(cafile=params.ca_cert_path or None)
    if params.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if params.client_cert_path:
        ctx.load_cert_chain(params.client_cert_path, params.client_key_path)
    return ctx


def page_url(endpoint: Endpoint, params: HttpSourceParams, host: str | None = None) -> str:
    """`{scheme}://{host}:{port}{path}` of a pod: its own host and port unless overridden."""
    port = params.port or endpoint.port
    name = host or endpoint.host
    if ":" in name and not name.startswith("["):  # an IPv6 address
        name = f"[{name}]"
    return f"{params.scheme}://{name}:{port}{params.path}"
