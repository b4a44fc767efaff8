"""outstanding-work-scorer through the gateway, on simulated pods: when a request's work
counts down, and that none is left behind whatever happens to the request."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from heimdall_proxy.plugins.scorers.outstanding_work import OutstandingWorkScorer
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


async def test_a_streams_prefill_counts_until_its_first_chunk_not_its_headers(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # Each engine step of this pod lasts half a second, its first (the prefill) included; like
    # vLLM, it sends a stream's response headers before that step ends.
    pod = await start_pod(time_scale=1.0, step_base=0.5)
    gw = await start_gateway(make_config([pod], WORK_EPP))
    scorer = scorer_of(gw)
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            assert r.status == 200
            # Headers only: the pod has not prefilled yet, all the work is outstanding.
            assert scorer.work(pod.name) == pytest.approx(PREFILL + 2)
            await r.content.readuntil(b"\n\n")  # the first token's event
            await eventually(lambda: scorer.work(pod.name) == pytest.approx(1))
            await r.read()
    await eventually(lambda: scorer.work(pod.name) == 0.0)
