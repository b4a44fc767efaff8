"""`heimdall-proxy conductor`: the KV cache indexer service (heimdall_proxy/conductor)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiohttp import web

from heimdall_proxy.cli.args import add_logging


def add_parser(sub: Any) -> None:
    cond = sub.add_parser(
        "conductor",
        help="run the KV cache indexer service",
        description="The KV cache indexer service: consumes engines' KV events and answers "
        "cache-hit queries over HTTP (see heimdall_proxy/conductor/README.md).",
    )
    cond.add_argument("--host", default="127.0.0.1")
    cond.add_argument("--port", type=int, default=8090)
    cond.add_argument("--hash-seed", type=int, default=None, help="XXH3 seed (default 1337)")
    cond.add_argument("--config", "-c", help="YAML: limits and publishers to register")
    add_logging(cond)


def run(args: argparse.Namespace) -> int:
    from heimdall_proxy.conductor.app import create_app as create_conductor
    from heimdall_proxy.conductor.settings import ConductorSettingsError, load_config

    try:
        config = load_config(args.config)
        app = create_conductor(config.options(args.hash_seed), config.registrations())
    except ConductorSettingsError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    print(f"conductor listening on http://{args.host}:{args.port}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0
