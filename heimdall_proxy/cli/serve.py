"""`heimdall-proxy [serve] --config FILE`: the gateway (without a config, the embedded demo
on simulated pods); `demo` runs through here too."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from typing import Any

from aiohttp import web

from heimdall_proxy.cli.args import add_server, duration, load_or_embedded, run_loop, server_options
from heimdall_proxy.cli.check_config import validate
from heimdall_proxy.cli.demo import demo_banner, start_sims
from heimdall_proxy.config.gateway import ConfigError, GatewayConfig, require_endpoints
from heimdall_proxy.config.options import ServerOptions

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the gateway (the default command)")
    serve.add_argument(
        "--config", "-c", help="YAML config; without it, the embedded demo (simulated pods) runs"
    )
    serve.add_argument(
        "--sim-pods",
        type=int,
        default=2,
        help="without --config: simulated pods the embedded demo starts",
    )
    serve.add_argument(
        "--watch-config",
        type=duration,
        nargs="?",
        const=1.0,
        default=0.0,
        metavar="INTERVAL",
        help="reload the config when its file changes, checked every INTERVAL (1s); SIGHUP "
        "reloads it in any case",
    )
    add_server(serve)


def run(args: argparse.Namespace) -> int:
    """`serve` and `demo`: build the app (config errors before any socket opens) and serve."""
    try:
        config = load_or_embedded(args.config)
        if args.command == "serve":
            model, pods = "sim-model", args.sim_pods
            if not args.config:
                log.warning(
                    "no --config: serving the embedded demo on %d SIMULATED pods", max(1, pods)
                )
        else:  # demo: always the simulated fleet, whatever endpoints the config lists
            model, pods = args.model, args.pods
            config = config.model_copy(update={"endpoints": []})
        options = server_options(args)
        # Config errors surface here, before any socket is opened. With real endpoints this
        # is the app that serves; simulated pods are only known once started, so for them the
        # plugins are validated now and the app is built on the pods later.
        from heimdall_proxy.server.app import create_app

        has_pods = bool(config.endpoints) or config.discovery.kubernetes is not None
        app = create_app(config, options) if has_pods else None
        if app is None:
            validate(config, options)
            if args.command == "serve" and args.config:  # a file's pods: never simulated ones
                require_endpoints(config)
        elif args.command == "serve" and args.config:
            from heimdall_proxy.server.reload import install_reloader

            install_reloader(app, args.config, args.watch_config)
        if app is None and args.command == "serve" and args.watch_config:
            log.warning("--watch-config is ignored: the simulated pods' config is not reloaded")
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    with contextlib.suppress(KeyboardInterrupt):
        sim_args = args if args.command == "demo" else None
        run_loop(serve_app(config, options, pods, model, sim_args, app))
    return 0


async def serve_app(
    config: GatewayConfig,
    options: ServerOptions,
    sim_pods: int,
    model: str,
    sim_args: argparse.Namespace | None = None,
    app: web.Application | None = None,
) -> None:
    """Serve `app`; without one, start simulated pods and build the app on them."""
    from heimdall_proxy.server.app import create_app, serve

    runners: list[web.AppRunner] = []
    try:
        banner = None
        if app is None:
            config = await start_sims(config, sim_pods, model, runners, sim_args)
            app = create_app(config, options)
            banner = demo_banner(options, model, len(runners))
        await serve(app, options, banner)
    finally:
        for runner in runners:
            await runner.cleanup()
