"""The routers the gateway is compared with: vllm-router from PyPI (`pip install vllm-router`,
any of its policies) and, for the overhead runs, the bare aiohttp forwarder
(bench/harness/bare_forwarder.py)."""

from __future__ import annotations

from collections.abc import Sequence

from bench.harness.procs import HOST, bench_module, console_script, free_port, http_get

ROUTER_POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)


def router_cmd() -> list[str]:
    return console_script("vllm-router", "vllm_router.launch_router")


def router_command(
    policy: str, urls: Sequence[str], port: int, extra: Sequence[str] = ()
) -> list[str]:
    """vllm-router with `policy` in front of `urls` on HOST:`port`."""
    return [
        *router_cmd(),
        "--host",
        HOST,
        "--port",
        str(port),
        "--policy",
        policy,
        "--worker-urls",
        *urls,
        "--worker-startup-check-interval",
        "1",
        "--prometheus-host",
        HOST,
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "warning",
        *extra,
    ]


def router_ready(url: str, n_pods: int) -> bool:
    """vllm-router's /readiness counts `n_pods` healthy workers."""
    status, body = http_get(url + "/readiness")
    return status == 200 and f'"healthy_workers":{n_pods}' in body.replace(" ", "")


def bare_forwarder_argv(port: int, upstream: str) -> list[str]:
    """The bare aiohttp forwarder on `port` in front of `upstream`."""
    return [
        *bench_module("bench.harness.bare_forwarder"),
        "--port",
        str(port),
        "--upstream",
        upstream,
    ]
