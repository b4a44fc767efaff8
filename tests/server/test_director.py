"""The director runs a request's whole life in llm-d's order: producers, then the admitter
plugins, then scheduling, then per attempt the pre-request and response hooks; a refusal by
an admitter answers the client before any pod is asked, and finishes what was admitted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp

import heimdall_proxy
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, RequestContext
from heimdall_proxy.server.app import create_app
from heimdall_proxy.server.gateway import GATEWAY
from tests.conftest import PodFactory, make_config
from tests.helpers import builtins_with

CALLS: list[str] = []


class Witness(BasePlugin[NoParams]):
    """A producer, an admitter and two hooks that write down when each runs."""

    type = "test-witness"

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        CALLS.append("produce")
        state["witness"] = len(endpoints)

    def admit_request(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> str | None:
        CALLS.append(f"admit saw {state.get('witness')} pods")
        return "refused by the witness" if request.data.get("refuse") else None

    async def pre_request(self, ctx: RequestContext) -> None:
        CALLS.append(f"pre_request {ctx.target.name}")

    async def response_complete(self, ctx: RequestContext) -> None:
        CALLS.append(f"response_complete {ctx.status}")


def registry() -> Registry:
    registry: Registry = builtins_with(**{"test-witness": Witness})
    return registry


async def test_a_request_lives_in_the_directors_order(
    start_pod: PodFactory, aiohttp_server: Any
) -> None:
    pods = [await start_pod(), await start_pod()]
    config = make_config(pods, {"plugins": [{"type": "test-witness"}, {"type": "random-picker"}]})
    app = create_app(config, ServerOptions(metrics_interval=0.02), registry())
    server = await aiohttp_server(app)
    gateway = app[GATEWAY]
    url = str(server.make_url("/v1/completions"))
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
    CALLS.clear()
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body) as resp:
            assert resp.status == 200
            served_by = resp.headers["x-sim-pod"]
        assert [
            "produce",
            "admit saw 2 pods",
            f"pre_request {served_by}",
            "response_complete 200",
        ] == CALLS

        CALLS.clear()
        async with http.post(url, json={**body, "refuse": True}) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "1"
            error = (await resp.json())["error"]
            assert error["message"] == "refused by the witness"
            assert error["code"] == "slo_unattainable"
    assert CALLS == ["produce", "admit saw 2 pods"]  # no pod, no hooks
    assert sum(len(p.pod.received) for p in pods) == 1
    # what flow control admitted is finished: nothing is left pending or in flight
    assert gateway.load.pending == 0
    assert not any(gateway.load.requests.values())
    assert gateway.routing.in_flight == 0


def test_admission_is_decided_in_one_place() -> None:
    """Flow control and the admitter plugins are asked only by server/admission.py."""
    root = Path(heimdall_proxy.__file__).parent
    callers = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if re.search(r"\.admit_request\(|\bflow\.admit\(", path.read_text())
    )
    assert callers == ["server/admission.py"]
