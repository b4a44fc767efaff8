"""`heimdall-proxy sim`: one simulated vLLM pod (heimdall_proxy/sim/README.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from heimdall_proxy.cli.args import add_logging, seconds

if TYPE_CHECKING:
    from heimdall_proxy.sim import SimOptions

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
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
    add_sim_engine(sim)
    add_logging(sim)


def add_sim_engine(p: argparse.ArgumentParser, demo: bool = False) -> None:
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
        add(flag, type=seconds, default=default, metavar="SECONDS", help=f"{what} ({default:g}s)")
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


async def run_sim(args: argparse.Namespace) -> None:
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
