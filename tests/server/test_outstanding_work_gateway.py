"""outstanding-work-scorer through the gateway, on simulated pods: when a request's work
counts down, and that none is left behind whatever happens to the request."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import RequestContext
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.scheduling.scorers.outstanding_work import OutstandingWorkScorer
from heimdall_proxy.server.app import GATEWAY, create_app
from tests.conftest import GatewayFactory, PodFactory, RunningGateway, eventually, make_config

WORK_EPP: dict[str, Any] = {
    "plugins": [{"type": "outstanding-work-scorer"}],
    "schedulingProfiles": [
        {"name": "default", "plugins": [{"pluginRef": "outstanding-work-scorer"}]}
    ],
}
#: 800 characters: 200 estimated prompt tokens, 40 units of prefill work at the default
#: prefillTokenWeight 0.2.
PROMPT = "w " * 400
PREFILL = 40.0


def scorer_of(gw: RunningGateway) -> OutstandingWorkScorer:
    scorer = gw.gateway.plugins.plugins["outstanding-work-scorer"]
    assert isinstance(scorer, OutstandingWorkScorer)
    return scorer


@pytest.mark.slow
async def test_a_streams_prefill_stops_counting_at_its_headers(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # Each engine step of this pod lasts half a second, its first (the prefill) included; like
    # vLLM, it sends a stream's response headers before that step ends. The prefill work goes
    # with the headers (ResponseReceived), the output tokens with the stream.
    pod = await start_pod(time_scale=1.0, step_base=0.5)
    gw = await start_gateway(make_config([pod], WORK_EPP))
    scorer = scorer_of(gw)
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as http:
        sent = asyncio.create_task(http.post(f"{gw.url}/v1/completions", json=body))
        await eventually(lambda: pod.pod.running == 1)
        async with await sent as r:
            assert r.status == 200
            assert scorer.work(pod.name) == pytest.approx(2)  # headers: prefill gone
            await r.content.readuntil(b"\n\n")  # the first token's event
            await eventually(lambda: scorer.work(pod.name) == pytest.approx(1))
            await r.read()
    await eventually(lambda: scorer.work(pod.name) == 0.0)


@pytest.mark.slow
async def test_a_non_streamed_requests_work_counts_until_it_completes(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod(time_scale=1.0, step_base=0.3)
    gw = await start_gateway(make_config([pod], WORK_EPP))
    scorer = scorer_of(gw)
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2}
    async with aiohttp.ClientSession() as http:
        sent = asyncio.create_task(http.post(f"{gw.url}/v1/completions", json=body))
        await eventually(lambda: pod.pod.running == 1)
        assert scorer.work(pod.name) == pytest.approx(PREFILL + 2)
        async with await sent as r:
            assert r.status == 200
            await r.read()
    assert scorer.work(pod.name) == 0.0  # removed before the answer was sent


@pytest.mark.slow
async def test_no_work_is_left_behind_by_failures_retries_or_disconnects(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    failing, slow = await start_pod(), await start_pod(time_scale=1.0, step_base=30.0)
    failing.pod.fail_status = 503
    broken = await start_pod()
    broken.pod.break_stream_after = 1
    gw = await start_gateway(make_config([failing, slow, broken], WORK_EPP))
    scorer = scorer_of(gw)
    pods = [failing, slow, broken]
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 4}
    async with aiohttp.ClientSession() as http:
        # 503s retried on the next pod; streams cut by the pod; answers from the slow pod
        # the client gives up on (each request can land on any pod).
        for stream in (False, True, False, True, False, True):
            try:
                async with http.post(
                    f"{gw.url}/v1/completions",
                    json={**body, "stream": stream},
                    timeout=aiohttp.ClientTimeout(total=0.5),
                ) as r:
                    await r.read()
            except (TimeoutError, aiohttp.ClientError):
                pass
    await eventually(lambda: all(scorer.work(p.name) == 0.0 for p in pods))
    assert gw.running() == 0


class HeldPreRequest(BasePlugin[NoParams]):
    """A pre-request plugin that waits for `release` (set by the test), as a plugin writing
    to a remote store waits for it; declared after outstanding-work-scorer, so that one has
    counted the request's work when the client goes away."""

    type = "test-held-pre-request"
    entered = asyncio.Event()
    release = asyncio.Event()

    async def pre_request(self, ctx: RequestContext) -> None:
        type(self).entered.set()
        await type(self).release.wait()


async def test_a_client_gone_during_pre_request_leaves_no_work(
    start_pod: PodFactory, aiohttp_server: Any
) -> None:
    HeldPreRequest.entered, HeldPreRequest.release = asyncio.Event(), asyncio.Event()
    registry = load_builtin_plugins()
    registry.register(HeldPreRequest.type)(HeldPreRequest)
    pod = await start_pod()
    epp = {**WORK_EPP, "plugins": [*WORK_EPP["plugins"], {"type": HeldPreRequest.type}]}
    app = create_app(make_config([pod], epp), ServerOptions(metrics_interval=0.02), registry)
    server: TestServer = await aiohttp_server(app)
    scorer = scorer_of(RunningGateway(server, app[GATEWAY]))
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2}
    async with aiohttp.ClientSession() as http:
        sent = asyncio.create_task(http.post(server.make_url("/v1/completions"), json=body))
        await asyncio.wait_for(HeldPreRequest.entered.wait(), 10)
        assert scorer.work(pod.name) == pytest.approx(PREFILL + 2)
        sent.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sent
    await eventually(lambda: scorer.work(pod.name) == 0.0)
    assert pod.pod.received == []


@pytest.mark.slow
async def test_a_non_streamed_request_counts_down_once_a_stream_showed_the_pace(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod(time_scale=1.0, step_base=0.05)  # about 20 tokens a second
    gw = await start_gateway(make_config([pod], WORK_EPP))
    scorer = scorer_of(gw)
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 4}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", json={**body, "stream": True}) as r:
            await r.read()
        # About three seconds of decoding, which the pod's answer alone would not show.
        sent = asyncio.create_task(
            http.post(f"{gw.url}/v1/completions", json={**body, "max_tokens": 60})
        )
        await eventually(lambda: pod.pod.running == 1)
        # Prefill gone and at least ten tokens counted down, while the request still runs.
        await eventually(lambda: pod.pod.running == 1 and 1.0 <= scorer.work(pod.name) < 50)
        async with await sent as r:
            assert r.status == 200
    assert scorer.work(pod.name) == 0.0
