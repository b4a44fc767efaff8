"""`heimdall-proxy sim` flags and the pods `heimdall-proxy demo` starts."""

from __future__ import annotations

import socket

import aiohttp
import pytest
import zmq.asyncio
from aiohttp import web

from heimdall_proxy.cli.demo import start_sims
from heimdall_proxy.cli.main import build_parser
from heimdall_proxy.cli.sim import sim_options
from heimdall_proxy.config.gateway import parse_config
from heimdall_proxy.sim import SimOptions
from tests.sim.conftest import prompt_of, recv_batches, subscribe


def test_sim_flags_map_to_options() -> None:
    args = build_parser().parse_args(
        [
            "sim",
            "--port", "9001",
            "--name", "pod-7",
            "--model", "llama",
            "--lora-modules", "a,b",
            "--max-loras", "2",
            "--max-num-seqs", "32",
            "--max-num-batched-tokens", "512",
            "--block-size", "32",
            "--num-gpu-blocks", "1000",
            "--no-enable-prefix-caching",
            "--step-base", "10ms",
            "--prefill-cost-per-token", "0.0001",
            "--time-scale", "0.5",
            "--seed", "3",
            "--kv-events-port", "5557",
            "--kv-events-format", "array",
            "--cpu-offload-blocks", "64",
            "--role", "prefill",
        ]
    )  # fmt: skip
    opts = sim_options(args)
    assert isinstance(opts, SimOptions)
    assert (opts.name, opts.model, opts.lora_modules, opts.max_loras) == (
        "pod-7",
        "llama",
        ["a", "b"],
        2,
    )
    assert (opts.max_num_seqs, opts.max_num_batched_tokens) == (32, 512)
    assert (opts.block_size, opts.num_gpu_blocks, opts.enable_prefix_caching) == (32, 1000, False)
    assert opts.step_base == 0.010 and opts.prefill_cost_per_token == 0.0001
    assert (opts.time_scale, opts.seed, opts.role) == (0.5, 3, "prefill")
    assert (opts.kv_events_port, opts.kv_events_format, opts.cpu_offload_blocks) == (
        5557,
        "array",
        64,
    )
    defaults = sim_options(build_parser().parse_args(["sim"]))
    assert defaults == SimOptions(name="sim-0", model="sim-model")


def _free_pair_base() -> int:
    """A port p with p .. p+3 free (two pods' PUB and replay sockets)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + 3 >= 65536:
            continue
        try:
            held = []
            for p in range(base, base + 4):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return base
    raise AssertionError("no free ports")


@pytest.mark.slow
async def test_demo_pods_each_publish_kv_events_on_their_own_port() -> None:
    base = _free_pair_base()
    args = build_parser().parse_args(
        ["demo", "--pods", "2", "--kv-events-port", str(base), "--time-scale", "0.01"]
    )
    runners: list[web.AppRunner] = []
    config = parse_config({}, "<test>")
    try:
        config = await start_sims(config, 2, "sim-model", runners, args)
        eps = config.endpoints
        assert [e.name for e in eps] == ["sim-0", "sim-1"]
        assert [e.kv_events for e in eps] == [
            f"tcp://127.0.0.1:{base}",
            f"tcp://127.0.0.1:{base + 2}",
        ]
        ctx = zmq.asyncio.Context.instance()
        sub = await subscribe(ctx, eps[1].kv_events or "", b"kv@sim-1@")
        try:
            async with aiohttp.ClientSession() as http:
                body = {"model": "sim-model", "prompt": prompt_of(40), "max_tokens": 1}
                async with http.post(f"{eps[1].url}/v1/completions", json=body) as r:
                    assert r.status == 200
            got, events = await recv_batches(sub, lambda ev: len(ev) >= 1)
            assert got[0][0] == b"kv@sim-1@sim-model"
            assert events[0]["type"] == "BlockStored"
        finally:
            sub.close()
    finally:
        for runner in runners:
            await runner.cleanup()
