"""Shared fixtures: simulated vLLM pods on real sockets and a gateway in front of them."""

from __future__ import annotations

import asyncio
import os

# No test reaches the Hugging Face Hub (this machine has no network): its client reads the
# caches only. Set before anything imports huggingface_hub, which reads it once.
os.environ["HF_HUB_OFFLINE"] = "1"
# No KV-event decode worker process unless a test asks for one (kvEventsConfig.decodeProcesses):
# spawning one per precise scorer made most of the suite's process start-ups.
os.environ["HEIMDALL_KV_DECODE_PROCESSES"] = "0"
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop
import zmq.asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from heimdall_proxy.config.gateway import GatewayConfig, parse_config
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.server.app import GATEWAY, create_app
from heimdall_proxy.server.gateway import Gateway
from heimdall_proxy.sim import SimOptions, SimPod


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast suite: leave out the tests marked `slow` (CI runs everything)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "uvloop: run the test on uvloop (as production runs) as well as on asyncio"
    )
    config.addinivalue_line(
        "markers",
        "slow: needs processes, Redis, real time or many cases; left out by --fast, run by CI",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """asyncio's loop for every test; uvloop's too for those marked `uvloop`: transports,
    signals and timers differ between the two, and the gateway runs on uvloop."""
    if item.get_closest_marker("uvloop") is not None:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@dataclass
class RunningPod:
    pod: SimPod
    server: TestServer
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.pod.options.name

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


@dataclass
class RunningGateway:
    server: TestServer
    gateway: Gateway

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.gateway.metrics.registry.get_sample_value(name, labels or {})

    def running(self, model: str = "sim-model") -> float:
        value = self.metric("inference_objective_running_requests", {"model_name": model})
        return value or 0.0

    async def settled(self, within: float = 10.0) -> None:
        """Wait until the gateway's view of every pod is idle: its last scrape showed nothing
        waiting or running, and started after the last request sent there (the scrape
        cadence calls that pod quiet). A pod is scraped as soon as a request is sent to it,
        which catches that request in its queue, and then only once per metrics interval: a
        test sending requests one after the other can otherwise have queue-scorer see a
        request that finished several requests ago (see datalayer/cadence.py)."""
        refresher = self.gateway.refresher
        assert refresher is not None, "the gateway does not scrape its pods"
        cadence, pool = refresher.cadence, self.gateway.pool
        await eventually(lambda: all(cadence.pod(e.name).quiet for e in pool.endpoints()), within)


PodFactory = Callable[..., Awaitable[RunningPod]]
GatewayFactory = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def start_pod(aiohttp_server: Any) -> PodFactory:
    count = 0

    async def go(labels: dict[str, str] | None = None, **options: Any) -> RunningPod:
        nonlocal count
        options.setdefault("name", f"pod-{count}")
        # The simulated engine runs at GPU speed by default; tests run it 100x faster.
        options.setdefault("time_scale", 0.01)
        count += 1
        pod = SimPod(SimOptions(**options))
        server = await aiohttp_server(pod.app())
        return RunningPod(pod, server, labels or {})

    return go


def make_config(
    pods: list[RunningPod],
    epp: dict[str, Any] | None = None,
    extra_endpoints: list[dict[str, Any]] | None = None,
) -> GatewayConfig:
    doc: dict[str, Any] = dict(epp or {})
    doc["endpoints"] = [{"name": p.name, "url": p.url, "labels": p.labels} for p in pods] + list(
        extra_endpoints or []
    )
    return parse_config(doc, "<test>")


@pytest.fixture
async def start_gateway(aiohttp_server: Any) -> GatewayFactory:
    async def go(config: GatewayConfig, **options: Any) -> RunningGateway:
        options.setdefault("metrics_interval", 0.02)
        options.setdefault("models_interval", 0.3)
        options.setdefault("startup_timeout", 2.0)
        app: web.Application = create_app(config, ServerOptions(**options))
        server = await aiohttp_server(app)
        return RunningGateway(server, app[GATEWAY])

    return go


async def eventually(check: Callable[[], bool], within: float = 5.0) -> None:
    """Wait until check() is true (background scrapes, cancellations)."""
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    """A ZMQ context for test publishers and subscribers, destroyed without lingering."""
    c = zmq.asyncio.Context()
    yield c
    c.destroy(linger=0)
