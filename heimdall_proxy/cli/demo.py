"""`heimdall-proxy demo`: simulated pods in-process plus the gateway; also what `serve` runs
without a config (the embedded demo)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from aiohttp import web

from heimdall_proxy.cli.args import add_server
from heimdall_proxy.cli.sim import add_sim_engine, sim_options
from heimdall_proxy.config.gateway import EndpointConfig, GatewayConfig
from heimdall_proxy.config.options import ServerOptions

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="simulated pods in-process plus the gateway")
    demo.add_argument("--pods", type=int, default=2)
    demo.add_argument("--model", default="sim-model")
    demo.add_argument(
        "--config", "-c", help="gateway config (default: the embedded config/recommended.yaml)"
    )
    add_server(demo)
    add_sim_engine(demo, demo=True)


def demo_banner(options: ServerOptions, model: str, pods: int) -> str:
    """What a newcomer needs once the demo listens: the base URL and a request to paste."""
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::", "") else options.host
    base = f"http://{host}:{options.port}/v1"
    auth = ' -H "Authorization: Bearer $KEY"' if options.api_keys else ""
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "hello"}}]}}'
    live = f"\n  live page: http://{host}:{options.port}/live" if options.live_page else ""
    return (
        f"heimdall-proxy demo: {pods} simulated pods behind {base} (model {model!r})\n"
        f"  curl -s {base}/chat/completions -H 'Content-Type: application/json'{auth} "
        f"-d '{body}'\n"
        f"  OpenAI SDK: OpenAI(base_url={base!r}, api_key='unused')" + live
    )


async def start_sims(
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
