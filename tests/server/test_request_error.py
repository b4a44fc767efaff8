"""Prepare-data plugins fail open, except when they raise RequestError on purpose: then the
client gets that answer, OpenAI-shaped, and no pod is asked."""

from __future__ import annotations

from typing import Any

import aiohttp

from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.framework.types import Endpoint, InferenceRequest
from heimdall_proxy.server.app import create_app
from tests.conftest import PodFactory, make_config
from tests.helpers import builtins_with


class Refuser(BasePlugin[NoParams]):
    type = "test-refuser"

    async def prepare_data(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        if request.data.get("refuse"):
            raise RequestError(
                409, "Refused on purpose.", code="refused", param="refuse", headers={"X-Why": "t"}
            )
        if request.data.get("crash"):
            raise RuntimeError("a bug in the plugin")


def registry() -> Registry:
    registry: Registry = builtins_with(**{"test-refuser": Refuser})
    return registry


async def test_request_error_is_the_answer_other_errors_fail_open(
    start_pod: PodFactory, aiohttp_server: Any
) -> None:
    pod = await start_pod()
    config = make_config([pod], {"plugins": [{"type": "test-refuser"}, {"type": "random-picker"}]})
    app = create_app(config, ServerOptions(metrics_interval=0.02), registry())
    server = await aiohttp_server(app)
    url = str(server.make_url("/v1/completions"))
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={**body, "refuse": True}) as resp:
            assert resp.status == 409
            assert resp.headers["X-Why"] == "t"
            assert await resp.json() == {
                "error": {
                    "message": "Refused on purpose.",
                    "type": "invalid_request_error",
                    "param": "refuse",
                    "code": "refused",
                }
            }
        assert pod.pod.received == []
        async with http.post(url, json={**body, "crash": True}) as resp:
            assert resp.status == 200  # a failing plugin does not fail the request
        assert len(pod.pod.received) == 1
