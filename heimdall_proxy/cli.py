"""Command line: `heimdall-proxy [serve] --config FILE`, `check-config FILE`, `sim`, `demo`,
`tokenizer-server`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from heimdall_proxy import __version__
from heimdall_proxy.config.gateway import (
    ConfigError,
    EndpointConfig,
    GatewayConfig,
    PluginConfig,
    load_config,
    require_endpoints,
)
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.params import parse_duration
from heimdall_proxy.observability.logs import setup_logging

if TYPE_CHECKING:
    from heimdall_proxy.config.build import PluginSet
    from heimdall_proxy.sim import SimOptions

log = logging.getLogger(__name__)

COMMANDS = ("serve", "check-config", "sim", "demo", "tokenizer-server", "conductor")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _verbosity(text: str) -> int:
    try:
        return int(text.lstrip("="))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"-v takes a number, got {text!r}") from exc


def _add_logging(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-v",
        "--v",
        dest="verbosity",
        type=_verbosity,
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


def _add_server(p: argparse.ArgumentParser, default_port: int = 8000) -> None:
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
    c.add_argument("--body-timeout", type=_duration, default=60.0, metavar="DURATION")
    c.add_argument(
        "--keepalive-timeout",
        type=_duration,
        default=15.0,
        metavar="DURATION",
        help="close a connection idle this long, or whose request headers take longer",
    )
    c.add_argument("--max-connections", type=int, default=4096)
    c.add_argument(
        "--drain-delay",
        type=_duration,
        default=0.0,
        metavar="DURATION",
        help="on SIGTERM, answer /ready 503 this long before closing the listener (0)",
    )
    c.add_argument(
        "--drain-timeout",
        type=_duration,
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
        "--metrics-interval",
        "--refresh-metrics-interval",
        dest="metrics_interval",
        type=_duration,
        default=0.1,
        metavar="DURATION",
        help="how often a busy pod's /metrics is scraped (default 100ms; GIE's "
        "refreshMetricsInterval)",
    )
    p.add_argument(
        "--idle-metrics-interval",
        type=_duration,
        default=1.0,
        metavar="DURATION",
        help="a pod with nothing queued or running that this gateway has sent nothing is "
        "scraped less and less often, down to once per this (default 1s; set it to the "
        "metrics interval to scrape every pod every interval)",
    )
    p.add_argument(
        "--models-interval",
        type=_duration,
        default=5.0,
        metavar="DURATION",
        help="how often each pod's /v1/models is refreshed (default 5s)",
    )
    p.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024)
    p.add_argument("--connect-timeout", type=_duration, default=5.0, metavar="DURATION")
    p.add_argument(
        "--upstream-timeout",
        type=_duration,
        default=0.0,
        metavar="DURATION",
        help="total time per upstream attempt; 0 = unlimited (default)",
    )
    p.add_argument(
        "--health-interval",
        type=_duration,
        default=5.0,
        metavar="DURATION",
        help="active health checks of each pod's /health (5s; 0 = off); 2 failures in a row "
        "take a pod out of rotation",
    )
    p.add_argument("--health-timeout", type=_duration, default=1.0, metavar="DURATION")
    p.add_argument(
        "--first-byte-timeout",
        type=_duration,
        default=600.0,
        metavar="DURATION",
        help="longest wait for a non-streamed answer (its first byte is its last); 10m",
    )
    p.add_argument(
        "--stream-idle-timeout",
        type=_duration,
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
    _add_logging(p)


def _seconds(text: str) -> float:
    """Seconds as a number ("0.008") or a Go duration ("8ms", "60us")."""
    try:
        return float(text)
    except ValueError:
        return _duration(text)


def _add_sim_engine(p: argparse.ArgumentParser, demo: bool = False) -> None:
    """Flags of the simulated pods (`sim`, and `demo` for every pod it starts)."""
    from heimdall_proxy.sim import SimOptions

    d = SimOptions()
    g = p.add_argument_group("simulated vLLM pod" + (" (every pod)" if demo else ""))
    add = g.add_argument
    add("--lora-modules", default="", help="comma-separated LoRA adapter names")
    add("--max-loras", type=int, default=d.max_loras, help="adapters resident at once")
    add("--role", choices=("both", "prefill", "decode", "encode"), default=d.role)
    add("--max-num-seqs", type=int, default=d.max_num_seqs)
    add("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    add("--max-model-len", type=int, default=d.max_model_len)
    add("--default-max-tokens", type=int, default=d.default_max_tokens)
    add("--block-size", type=int, default=d.block_size)
    add("--num-gpu-blocks", type=int, default=d.num_gpu_blocks)
    add(
        "--no-enable-prefix-caching",
        dest="enable_prefix_caching",
        action="store_false",
        help="disable prefix caching",
    )
    add("--cpu-offload-blocks", type=int, default=0, help="blocks of a CPU tier (0: none)")
    for flag, default, what in (
        ("--step-base", d.step_base, "fixed time of one engine step"),
        ("--prefill-cost-per-token", d.prefill_cost_per_token, "per prompt token computed"),
        ("--decode-cost-per-seq", d.decode_cost_per_seq, "per decoding request in a step"),
        ("--kv-read-cost-per-token", d.kv_read_cost_per_token, "per context token decoded"),
        ("--lora-load-time", d.lora_load_time, "loading an adapter that is not resident"),
        ("--kv-transfer-cost-per-block", d.kv_transfer_cost_per_block, "remote prefill pull"),
        ("--cpu-load-cost-per-block", d.cpu_load_cost_per_block, "CPU tier hit"),
        ("--encode-cost-per-item", d.encode_cost_per_item, "multimodal encoder, per item"),
    ):
        add(flag, type=_seconds, default=default, metavar="SECONDS", help=f"{what} ({default:g}s)")
    add("--mm-tokens-per-item", type=int, default=d.mm_tokens_per_item)
    add(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help="multiplies every simulated duration (0.01: 100x faster)",
    )
    add("--seed", type=int, default=None, help="seeded, deterministic outputs")
    add(
        "--kv-events-port",
        type=int,
        default=None,
        help="ZMQ PUB port of KV events (0 or unset: off)"
        + ("; pod i uses PORT+2i (replay +1)" if demo else ""),
    )
    if not demo:
        add("--kv-events-replay-port", type=int, default=None, help="default: PUB port + 1")
    add("--kv-events-host", default=d.kv_events_host)
    add("--kv-events-topic", default=d.kv_events_topic, help="{name}, {model}, {host} filled in")
    add("--kv-events-format", choices=("map", "array"), default=d.kv_events_format)
    add("--kv-events-hash", choices=("int", "bytes"), default=d.kv_events_hash)
    add("--advertise-host", default=d.advertise_host, help="remote_host in transfer params")
    add("--side-channel-port", type=int, default=d.side_channel_port)
    add("--ec-storage-path", default=None, help="directory shared with encode pods")
    add(
        "--no-ec-transfer-params",
        dest="ec_transfer_params",
        action="store_false",
        help="encode pods answer without ec_transfer_params (shared-storage EC connectors)",
    )
    if not demo:
        add("--engine-id", default=None)
        add(
            "--fault-control",
            action="store_true",
            help="serve POST /sim/fault to inject failures from another process (benchmarks)",
        )


def sim_options(args: argparse.Namespace, **overrides: Any) -> SimOptions:
    """SimOptions from `sim` / `demo` flags; `overrides` win."""
    from dataclasses import fields

    from heimdall_proxy.sim import SimOptions

    values: dict[str, Any] = {}
    for f in fields(SimOptions):
        if hasattr(args, f.name):
            values[f.name] = getattr(args, f.name)
    values["lora_modules"] = [m for m in getattr(args, "lora_modules", "").split(",") if m]
    values.update(overrides)
    return SimOptions(**values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heimdall-proxy",
        description="OpenAI-compatible LLM request router running Heimdall's endpoint-picker "
        "plugins in-process in front of vLLM.",
    )
    parser.add_argument("--version", action="version", version=f"heimdall-proxy {__version__}")
    sub = parser.add_subparsers(dest="command")

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
        type=_duration,
        nargs="?",
        const=1.0,
        default=0.0,
        metavar="INTERVAL",
        help="reload the config when its file changes, checked every INTERVAL (1s); SIGHUP "
        "reloads it in any case",
    )
    _add_server(serve)

    check = sub.add_parser("check-config", help="validate a config and print the profiles")
    check.add_argument("config")
    check.add_argument("-v", "--v", dest="verbosity", type=_verbosity, default=0)

    sim = sub.add_parser(
        "sim",
        help="run one simulated vLLM pod",
        description="One simulated vLLM pod: vLLM's API, metrics and KV events in front of a "
        "continuous-batching engine model (see heimdall_proxy/sim/README.md).",
    )
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8001)
    sim.add_argument("--name", default="sim-0")
    sim.add_argument("--model", default="sim-model")
    _add_sim_engine(sim)
    _add_logging(sim)

    demo = sub.add_parser("demo", help="simulated pods in-process plus the gateway")
    demo.add_argument("--pods", type=int, default=2)
    demo.add_argument("--model", default="sim-model")
    demo.add_argument(
        "--config", "-c", help="gateway config (default: the embedded config/recommended.yaml)"
    )
    _add_server(demo)
    _add_sim_engine(demo, demo=True)

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
    _add_logging(cond)

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
    _add_logging(tok)
    return parser


def _env_list(name: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in os.environ.get(name, "").split(",") if v.strip())


def _server_options(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(
        host=args.host,
        port=args.port,
        response_header=args.response_header,
        debug_routes=args.debug_routes,
        api_keys=tuple(args.api_key) + _env_list("HEIMDALL_API_KEYS"),
        admin_api_keys=tuple(args.admin_api_key) + _env_list("HEIMDALL_ADMIN_API_KEYS"),
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


def _demo_config_text() -> str:
    return resources.files("heimdall_proxy").joinpath("configs/recommended.yaml").read_text("utf-8")


def _load(path: str | None) -> GatewayConfig:
    if path:
        return load_config(path)
    import yaml

    from heimdall_proxy.config.gateway import parse_config

    return parse_config(yaml.safe_load(_demo_config_text()), "<embedded recommended.yaml>")


def raise_open_files_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit. A gateway holds a
    scrape connection, upstream connections and, with KV events, a subscription per pod, so
    a thousand pods pass the usual soft limit of 1,024; Go's runtime raises it the same way
    for GIE's and llm-d's EPP, so their users never met it."""
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


def _run(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported OS
        asyncio.run(coro)


async def _serve(
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
            config = await _start_sims(config, sim_pods, model, runners, sim_args)
            app = create_app(config, options)
            banner = demo_banner(options, model, len(runners))
        await serve(app, options, banner)
    finally:
        for runner in runners:
            await runner.cleanup()


def demo_banner(options: ServerOptions, model: str, pods: int) -> str:
    """What a newcomer needs once the demo listens: the base URL and a request to paste."""
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::", "") else options.host
    base = f"http://{host}:{options.port}/v1"
    auth = ' -H "Authorization: Bearer $KEY"' if options.api_keys else ""
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "hello"}}]}}'
    return (
        f"heimdall-proxy demo: {pods} simulated pods behind {base} (model {model!r})\n"
        f"  curl -s {base}/chat/completions -H 'Content-Type: application/json'{auth} "
        f"-d '{body}'\n"
        f"  OpenAI SDK: OpenAI(base_url={base!r}, api_key='unused')"
    )


async def _start_sims(
    config: GatewayConfig,
    n: int,
    model: str,
    runners: list[web.AppRunner],
    sim_args: argparse.Namespace | None = None,
) -> GatewayConfig:
    """Start n simulated pods on free ports (with `demo`'s pod flags, when given) and put them
    in the config's endpoints; pod i publishes KV events on kv_events_port + 2i."""
    from heimdall_proxy.sim import SimOptions, SimPod

    endpoints = []
    base_port = getattr(sim_args, "kv_events_port", None) or None
    for i in range(max(1, n)):
        name = f"sim-{i}"
        kv_port = base_port + 2 * i if base_port else None
        if sim_args is not None:
            opts = sim_options(sim_args, name=name, model=model, kv_events_port=kv_port)
        else:
            opts = SimOptions(name=name, model=model)
        pod = SimPod(opts)
        runner = web.AppRunner(pod.app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        kv_events = pod.kv_events_endpoint
        endpoints.append(
            EndpointConfig(name=name, url=f"http://127.0.0.1:{port}", kvEvents=kv_events)
        )
        log.info(
            "simulated vLLM pod %s (model %s) on http://127.0.0.1:%d%s",
            name,
            model,
            port,
            f", KV events on {kv_events}" if kv_events else "",
        )
    return config.model_copy(update={"endpoints": endpoints})


async def _sim(args: argparse.Namespace) -> None:
    from heimdall_proxy.sim import SimPod

    pod = SimPod(sim_options(args))
    runner = web.AppRunner(pod.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    log.info(
        "simulated vLLM pod %s serving %s on http://%s:%d%s",
        args.name,
        args.model,
        args.host,
        args.port,
        f", KV events on {pod.kv_events_endpoint}" if pod.kv_events_endpoint else "",
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def conductor(args: argparse.Namespace) -> int:
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


def tokenizer_server(args: argparse.Namespace) -> int:
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
            _run(coro)
    except (TokenizerNotFoundError, OSError, ValueError, ImportError) as exc:
        print(f"tokenizer-server: {exc}", file=sys.stderr)
        return 1
    return 0


def validate(config: GatewayConfig, options: ServerOptions) -> PluginSet:
    """Build the config's plugins exactly as `serve` does, without a gateway around them.
    Raises ConfigError."""
    from heimdall_proxy.config.build import build_plugins
    from heimdall_proxy.datalayer.pool import EndpointPool
    from heimdall_proxy.framework.handle import PluginHandle
    from heimdall_proxy.plugins.builtins import load_builtin_plugins

    handle = PluginHandle(
        pool=EndpointPool(config.endpoints), feature_gates=frozenset(config.epp.feature_gates)
    )
    extra = [PluginConfig(type="response-header-handler")] if options.response_header else []
    return build_plugins(config.epp, load_builtin_plugins(), handle, extra=extra)


def check_config(path: str) -> int:
    """Validate like `serve` does and print the resolved plugins and profiles."""
    try:
        config = load_config(path)
        pset = validate(config, ServerOptions())
        require_endpoints(config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    print(describe(config, pset))
    return 0


def describe(cfg: GatewayConfig, pset: PluginSet) -> str:
    from heimdall_proxy.framework.plugins import extension_points

    out = [f"config OK: {cfg.source}"]
    out.append(f"feature gates: {', '.join(cfg.epp.feature_gates) or '(none)'}")
    k8s = cfg.discovery.kubernetes
    if k8s is not None:
        where = f"namespace {k8s.namespace!r}" if k8s.namespace else "all namespaces"
        out.append(
            f"discovery: kubernetes pods {k8s.label_selector()} in {where}, port {k8s.target_port}"
        )
    out.append("endpoints:")
    for ep in cfg.endpoints:
        labels = ", ".join(f"{k}={v}" for k, v in ep.labels.items())
        out.append(f"  {ep.name}  {ep.url}" + (f"  [{labels}]" if labels else ""))
    out.append("plugins:")
    for name, plugin in pset.plugins.items():
        params = getattr(plugin, "params", None)
        shown = params.model_dump(by_alias=True, exclude_none=True) if params is not None else {}
        out.append(
            f"  {name} (type {getattr(plugin, 'type', '?')}): {', '.join(extension_points(plugin))}"
            + (f"  {shown}" if shown else "")
        )
    for name, gate in pset.skipped.items():
        out.append(f"  {name}: skipped, feature gate {gate!r} not enabled")
    if pset.data_sources:
        out.append("data sources:")
        for wired in pset.data_sources:
            extractors = ", ".join(name for name, _ in wired.extractors)
            out.append(f"  {wired.name} -> {extractors}")
    suffix = " (default)" if pset.handler_defaulted else ""
    out.append(f"profile handler: {pset.handler_name}{suffix}")
    out.append("scheduling profiles:")
    for prof in pset.resolved_profiles:
        out.append(f"  {prof.name}:")
        out.append(f"    filters: {', '.join(prof.filters) or '(none)'}")
        scorers = ", ".join(f"{n} (weight {w:g})" for n, w in prof.scorers)
        out.append(f"    scorers: {scorers or '(none)'}")
        out.append(f"    picker:  {prof.picker}" + (" (default)" if prof.picker_defaulted else ""))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (
        args_list[0] not in COMMANDS and args_list[0] not in ("-h", "--help", "--version")
    ):
        args_list.insert(0, "serve")
    args = build_parser().parse_args(args_list)
    if args.command == "check-config":
        setup_logging(args.verbosity, "text")
        return check_config(args.config)
    setup_logging(args.verbosity, args.log_format)
    raise_open_files_limit()
    if args.command == "sim":
        _run(_sim(args))
        return 0
    if args.command == "tokenizer-server":
        return tokenizer_server(args)
    if args.command == "conductor":
        return conductor(args)
    try:
        config = _load(args.config)
        if args.command == "serve":
            model, pods = "sim-model", args.sim_pods
            if not args.config:
                log.warning(
                    "no --config: serving the embedded demo on %d SIMULATED pods", max(1, pods)
                )
        else:  # demo: always the simulated fleet, whatever endpoints the config lists
            model, pods = args.model, args.pods
            config = config.model_copy(update={"endpoints": []})
        options = _server_options(args)
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
        _run(_serve(config, options, pods, model, sim_args, app))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
