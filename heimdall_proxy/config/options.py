"""The server's own settings (the command line's, not the EndpointPickerConfig's)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ServerOptions:
    host: str = "0.0.0.0"
    port: int = 8000
    response_header: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    metrics_interval: float = 0.1
    #: A quiet pod's scrape interval backs off up to this (datalayer/cadence.py).
    idle_metrics_interval: float = 1.0
    metrics_timeout: float = 1.0
    models_interval: float = 5.0
    #: Active health checks of every pod's /health (0: off).
    health_interval: float = 5.0
    health_timeout: float = 1.0
    connect_timeout: float = 5.0
    #: Total time allowed for one upstream attempt; None = unlimited (long generations).
    upstream_timeout: float | None = None
    #: Longest wait for the first byte of a non-streamed answer (which arrives whole, at
    #: the end), and longest silence of a streamed one, its start included. A timeout before
    #: the first byte is a pod failure and goes to the next pod; one mid-stream breaks the
    #: client's stream.
    first_byte_timeout: float = 600.0
    stream_idle_timeout: float = 300.0
    #: Pods tried per request (the picked one, then the next-best ones).
    max_attempts: int = 3
    pool_name: str = "heimdall"
    #: How long start-up waits for the first metrics and model scrape of every pod.
    startup_timeout: float = 5.0
    #: Serve POST /debug/route/v1/... (see server/debug.py). Off by default: it shows pod
    #: names and scores to whoever can reach the gateway.
    debug_routes: bool = False
    #: Serve the live page, GET /live (see server/live.py): the pool, recent picks and
    #: drawn decisions; its data needs an admin key when keys are on. Off by default.
    live_page: bool = False
    #: API keys (Bearer) every route but /health, /ready and /metrics needs; empty: open.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    #: Keys that may also use the allowlisted and debug routes.
    admin_api_keys: tuple[str, ...] = field(default=(), repr=False)
    #: The pods' own key (vLLM's --api-key), sent as `Authorization: Bearer` on every request
    #: to a pod (scrapes too). A client's Authorization is forwarded only when the gateway
    #: neither checks keys nor has this: a gateway key must not reach the model servers.
    upstream_api_key: str | None = field(default=None, repr=False)
    #: Without keys: the header whose value identifies the caller (owner of stored responses).
    owner_header: str | None = None
    #: Paths forwarded besides the inference routes (POST), e.g. /tokenize; admin key if keys.
    allow_routes: tuple[str, ...] = ()
    #: Forward the client's kv_transfer_params / ec_transfer_params (they make decode pods
    #: dial the addresses in them): only behind a trusted client.
    trust_client_transfer_params: bool = False
    #: Connection hygiene: how long an idle connection stays open, which also bounds the time
    #: a client may take to send a request's headers; the time to send its body; open
    #: connections at most (server/connections.py).
    body_timeout: float = 60.0
    keepalive_timeout: float = 15.0
    max_connections: int = 4096
    #: Shutdown in two phases: on SIGTERM /ready answers 503 for `drain_delay` seconds (load
    #: balancers stop sending), then the listener closes and requests in flight get up to
    #: `drain_timeout` seconds to finish.
    drain_delay: float = 0.0
    drain_timeout: float = 30.0
    #: OpenTelemetry spans per request (observability/tracing.py); the OTEL_* environment can also
    #: turn them on.
    otel: bool = False
