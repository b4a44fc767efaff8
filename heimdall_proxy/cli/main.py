"""The `heimdall-proxy` command: picks the subcommand (`serve` when none is named) and hands
the parsed arguments to its module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from heimdall_proxy import __version__
from heimdall_proxy.cli import (
    check_config,
    conductor,
    demo,
    plugin_reference,
    serve,
    sim,
    tokenizer_server,
)
from heimdall_proxy.cli.args import raise_open_files_limit, run_loop
from heimdall_proxy.observability.logs import setup_logging

COMMANDS = (
    "serve",
    "check-config",
    "sim",
    "demo",
    "tokenizer-server",
    "conductor",
    "plugin-reference",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heimdall-proxy",
        description="OpenAI-compatible LLM request router running Heimdall's endpoint-picker "
        "plugins in-process in front of vLLM.",
    )
    parser.add_argument("--version", action="version", version=f"heimdall-proxy {__version__}")
    sub = parser.add_subparsers(dest="command")
    for command in (serve, check_config, sim, demo, conductor, tokenizer_server, plugin_reference):
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (
        args_list[0] not in COMMANDS and args_list[0] not in ("-h", "--help", "--version")
    ):
        args_list.insert(0, "serve")
    args = build_parser().parse_args(args_list)
    if args.command == "check-config":
        setup_logging(args.verbosity, "text")
        return check_config.check_config(args.config)
    if args.command == "plugin-reference":
        return plugin_reference.run(args)
    setup_logging(args.verbosity, args.log_format)
    raise_open_files_limit()
    if args.command == "sim":
        run_loop(sim.run_sim(args))
        return 0
    if args.command == "tokenizer-server":
        return tokenizer_server.run(args)
    if args.command == "conductor":
        return conductor.run(args)
    return serve.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
