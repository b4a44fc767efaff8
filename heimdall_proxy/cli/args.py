"""What the commands share: argument types, the logging and server flag groups, the server's
options from them, the config (a file's, or the embedded one), and the event loop."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Coroutine
from importlib import resources
from typing import Any

from heimdall_proxy.config.gateway import GatewayConfig, load_config
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.params import parse_duration

log = logging.getLogger(__name__)


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def verbosity(text: str) -> int:
    try:
        return int(text.lstrip("="))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"-v takes a number, got {text!r}") from exc


def seconds(text: str) -> float:
    """Seconds as a number ("0.008") or a Go duration ("8ms", "60us")."""
    try:
        return float(text)
    except ValueError:
        return duration(text)


def add_logging(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-v",
        "--v",
        dest="verbosity",
        type=verbosity,
        default=0,
        metavar="N",
        help="log verbosity; 4 logs every plugin run per request",
    )
    p.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=None,
        help="default: text on a terminal, JSON otherwise",
    )


def add_server(p: argparse.ArgumentParser, default_port: int = 8000) -> None:
    p.add_argument(
        "--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0: every interface)"
    )
    p.add_argument("--port", type=int, default=default_port)
    p.add_argument(
        "--response-header",
        action="store_true",
        help="set x-decoder-host-port (and x-prefiller-host-port) on responses",
    )
    g = p.add_argument_group("access")
    g.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require Authorization: Bearer KEY (repeatable; also HEIMDALL_API_KEYS, "
        "comma-separated); /health, /ready and /metrics stay open",
    )
    g.add_argument(
        "--admin-api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a key that may also use --allow-route and debug routes (repeatable; also "
        "HEIMDALL_ADMIN_API_KEYS)",
    )
    g.add_argument(
        "--upstream-api-key",
        metavar="KEY",
        help="send Authorization: Bearer KEY to the pods (vLLM's --api-key; also "
        "HEIMDALL_UPSTREAM_API_KEY). A client's Authorization is never forwarded when the "
        "gateway checks keys itself or this is set",
    )
    g.add_argument(
        "--owner-header",
        metavar="NAME",
        help="without API keys: the header that identifies the caller owning stored responses",
    )
    g.add_argument(
        "--allow-route",
        action="append",
        default=[],
        metavar="PATH",
        help="forward POST PATH too (only the inference routes are by default), e.g. /tokenize",
    )
    g.add_argument(
        "--trust-client-transfer-params",
        action="store_true",
        help="forward the client's kv_transfer_params / ec_transfer_params (dropped by default)",
    )
    c = p.add_argument_group("client connections")
    c.add_argument("--body-timeout", type=duration, default=60.0, metavar="DURATION")
    c.add_argument(
        "--keepalive-timeout",
        type=duration,
        default=15.0,
        metavar="DURATION",
        help="close a connection idle this long, or whose request headers take longer",
    )
    c.add_argument("--max-connections", type=int, default=4096)
    c.add_argument(
        "--drain-delay",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="on SIGTERM, answer /ready 503 this long before closing the listener (0)",
    )
    c.add_argument(
        "--drain-timeout",
        type=duration,
        default=30.0,
        metavar="DURATION",
        help="then, how long requests in flight may take to finish (30s)",
    )
    p.add_argument(
        "--debug-routes",
        action="store_true",
        help="serve POST /debug/route/v1/...: the scheduling decision for a body, not forwarded",
    )
    p.add_argument(
        "--live-page",
        action="store_true",
        help="serve GET /live: the pool, recent picks and decisions drawn, updated live "
        "(its data needs an admin key when keys are on)",
    )
    p.add_argument(
        "--metrics-interval",
        "--refresh-metrics-interval",
        dest="metrics_interval",
        type=duration,
        default=0.1,
        metavar="DURATION",
        help="how often a busy pod's /metrics is scraped (default 100ms; GIE's "
        "refreshMetricsInterval)",
    )
    p.add_argument(
        "--idle-metrics-interval",
        type=duration,
        default=1.0,
        metavar="DURATION",
        help="a pod with nothing queued or running that this gateway has sent nothing is "
        "scraped less and less often, down to once per this (default 1s; set it to the "
        "metrics interval to scrape every pod every interval)",
    )
    p.add_argument(
        "--models-interval",
        type=duration,
        default=5.0,
        metavar="DURATION",
        help="how often each pod's /v1/models is refreshed (default 5s)",
    )
    p.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024)
    p.add_argument("--connect-timeout", type=duration, default=5.0, metavar="DURATION")
    p.add_argument(
        "--upstream-timeout",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="total time per upstream attempt; 0 = unlimited (default)",
    )
    p.add_argument(
        "--health-interval",
        type=duration,
        default=5.0,
        metavar="DURATION",
        help="active health checks of each pod's /health (5s; 0 = off); 2 failures in a row "
        "take a pod out of rotation",
    )
    p.add_argument("--health-timeout", type=duration, default=1.0, metavar="DURATION")
    p.add_argument(
        "--first-byte-timeout",
        type=duration,
        default=600.0,
        metavar="DURATION",
        help="longest wait for a non-streamed answer (its first byte is its last); 10m",
    )
    p.add_argument(
        "--stream-idle-timeout",
        type=duration,
        default=300.0,
        metavar="DURATION",
        help="longest silence of a streamed answer, its start (a queued prefill) included; 5m",
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=3,
        help="pods tried per request when a pod cannot be reached (default 3)",
    )
    p.add_argument(
        "--otel",
        action="store_true",
        help="OpenTelemetry spans per request, exported as the OTEL_* environment says "
        "(default OTLP/HTTP); also on when OTEL_TRACES_EXPORTER or an OTLP endpoint is set. "
        "Needs the otel extra",
    )
    p.add_argument("--pool-name", default="heimdall")
    add_logging(p)


def env_list(name: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in os.environ.get(name, "").split(",") if v.strip())


def server_options(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(
        host=args.host,
        port=args.port,
        response_header=args.response_header,
        debug_routes=args.debug_routes,
        live_page=args.live_page,
        api_keys=tuple(args.api_key) + env_list("HEIMDALL_API_KEYS"),
        admin_api_keys=tuple(args.admin_api_key) + env_list("HEIMDALL_ADMIN_API_KEYS"),
        owner_header=args.owner_header,
        upstream_api_key=args.upstream_api_key
        or os.environ.get("HEIMDALL_UPSTREAM_API_KEY")
        or None,
        allow_routes=tuple(args.allow_route),
        trust_client_transfer_params=args.trust_client_transfer_params,
        body_timeout=args.body_timeout,
        keepalive_timeout=args.keepalive_timeout,
        max_connections=args.max_connections,
        drain_delay=args.drain_delay,
        drain_timeout=args.drain_timeout,
        max_body_bytes=args.max_body_bytes,
        metrics_interval=args.metrics_interval,
        idle_metrics_interval=args.idle_metrics_interval,
        models_interval=args.models_interval,
        connect_timeout=args.connect_timeout,
        upstream_timeout=args.upstream_timeout or None,
        first_byte_timeout=args.first_byte_timeout,
        health_interval=args.health_interval,
        health_timeout=args.health_timeout,
        stream_idle_timeout=args.stream_idle_timeout,
        max_attempts=args.max_attempts,
        otel=args.otel,
        pool_name=args.pool_name,
    )


def embedded_config_text() -> str:
    return resources.files("heimdall_proxy").joinpath("configs/recommended.yaml").read_text("utf-8")


def load_or_embedded(path: str | None) -> GatewayConfig:
    if path:
        return load_config(path)
    import yaml

    from heimdall_proxy.config.gateway import parse_config

    return parse_config(yaml.safe_load(embedded_config_text()), "<embedded recommended.yaml>")


def raise_open_files_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit (logged). A gateway
    holds a scrape connection, upstream connections and, with KV events, a TCP connection per
    pod (kvcache.subscriber.fd_budget), so a thousand pods pass the usual soft limit of
    1,024; Go's runtime raises it the same way for GIE's and llm-d's EPP, so their users
    never met it."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Linux refuses an infinite limit (it is capped by fs.nr_open): ask for 2**20 then.
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)
    else:
        # said, so an operator reading a descriptor count knows the ceiling it is under
        log.info("raised the open files soft limit from %d to %d (the hard limit)", soft, target)


def run_loop(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported OS
        asyncio.run(coro)
