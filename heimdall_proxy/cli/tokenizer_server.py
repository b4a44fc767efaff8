"""`heimdall-proxy tokenizer-server`: tokenization on a Unix socket, speaking the llm-d
tokenizer sidecar's gRPC protocol."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from heimdall_proxy.cli.args import add_logging, run_loop


def add_parser(sub: Any) -> None:
    tok = sub.add_parser(
        "tokenizer-server",
        help="serve tokenization on a Unix socket (the tokenizer plugin's udsTokenizerConfig)",
        description="Tokenizes OpenAI request bodies as vLLM does (chat templates included) for "
        "gateways on the same host, speaking the llm-d tokenizer sidecar's gRPC protocol "
        "(TokenizationService, heimdall_proxy/tokenization/tokenizerpb/tokenizer.proto), so "
        "it and the llm-d sidecar can stand in for each other.",
    )
    tok.add_argument("--socket", required=True, help="socket path (host:port with --tcp)")
    tok.add_argument("--tcp", action="store_true", help="listen on TCP host:port instead")
    tok.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[NAME=]MODEL",
        help="a model directory (or tokenizer.json, or a model in the local HF cache); "
        "repeat for several models",
    )
    tok.add_argument(
        "--sim-model",
        action="append",
        default=[],
        metavar="NAME",
        help="serve NAME with the simulator's deterministic tokenization (`heimdall-proxy "
        "sim` pods), so a gateway's token ids and block keys match the simulated fleet's",
    )
    tok.add_argument(
        "--mistral-model",
        action="append",
        default=[],
        metavar="[NAME=]MODEL",
        help="a Mistral model directory (tekken.json or tokenizer.model.v*) tokenized as vLLM's "
        "tokenizer mode mistral does (needs the 'mistral' extra); repeatable",
    )
    tok.add_argument(
        "--load-on-demand",
        action="store_true",
        help="also load any other model a client names (InitializeTokenizer), from a directory, "
        "the Hugging Face cache or the Hub, as the llm-d sidecar does",
    )
    tok.add_argument("--workers", type=int, default=4, help="tokenizer threads (default 4)")
    add_logging(tok)


def run(args: argparse.Namespace) -> int:
    from heimdall_proxy.tokenization.resolve import TokenizerNotFoundError
    from heimdall_proxy.tokenization.uds_server import run_server

    try:
        if not (args.model or args.sim_model or args.mistral_model or args.load_on_demand):
            raise ValueError(
                "give at least one --model, --mistral-model or --sim-model, or --load-on-demand"
            )
        from heimdall_proxy.sim.tokens import SimRequestTokenizer
        from heimdall_proxy.tokenization.mistral import load_mistral_models
        from heimdall_proxy.tokenization.uds_server import ServedTokenizer

        # the composition root hands the simulator's tokenization in: tokenization/ never
        # imports the simulator
        extra: dict[str, ServedTokenizer] = {n: SimRequestTokenizer() for n in args.sim_model}
        extra.update(load_mistral_models(args.mistral_model))
        coro = run_server(
            args.socket, args.model, args.workers, args.tcp, extra, args.load_on_demand
        )
        with contextlib.suppress(KeyboardInterrupt):
            run_loop(coro)
    except (TokenizerNotFoundError, OSError, ValueError, ImportError) as exc:
        print(f"tokenizer-server: {exc}", file=sys.stderr)
        return 1
    return 0
