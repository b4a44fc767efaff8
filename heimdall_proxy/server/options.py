"""The server's own settings (the command line's, not the EndpointPickerConfig's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ServerOptions:
    host: str = "0.0.0.0"
    port: int = 8000
    response_header: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    metrics_interval: float = 0.1
    metrics_timeout: float = 1.0
    models_interval: float = 5.0
    connect_timeout: float = 5.0
    #: Total time allowed for one upstream attempt; None = unlimited (long generations).
    upstream_timeout: float | None = None
    #: Pods tried per request (the picked one, then the next-best ones).
    max_attempts: int = 3
    pool_name: str = "heimdall"
    #: How long start-up waits for the first metrics and model scrape of every pod.
    startup_timeout: float = 5.0
    #: Serve POST /debug/route/v1/... (see server/debug.py). Off by default: it shows pod
    #: names and scores to whoever can reach the gateway.
    debug_routes: bool = False
