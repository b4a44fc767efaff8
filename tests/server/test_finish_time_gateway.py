"""finish-time-scorer through the gateway, on simulated pods: the ledger learns each pod's
pace from real streams, and once it has, requests go to the pod that finishes them first."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.finish_time import FinishTimeScorer
from tests.conftest import GatewayFactory, PodFactory, make_config
from tests.plugins.helpers import req

FINISH_EPP: dict[str, Any] = {
    "plugins": [{"type": "finish-time-scorer"}, {"type": "max-score-picker"}],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [{"pluginRef": "finish-time-scorer"}, {"pluginRef": "max-score-picker"}],
        }
    ],
}


@pytest.mark.slow
@pytest.mark.uvloop
async def test_requests_go_to_the_pod_whose_pace_finishes_them_first(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # The same engine, one pod four times slower per step (an older GPU, say).
    fast = await start_pod(time_scale=1.0, step_base=0.005)
    slow = await start_pod(time_scale=1.0, step_base=0.02)
    gw = await start_gateway(make_config([fast, slow], FINISH_EPP))
    scorer = gw.gateway.plugins.plugins["finish-time-scorer"]
    assert isinstance(scorer, FinishTimeScorer)
    load = scorer.load
    body = {"model": "sim-model", "prompt": "w " * 50, "max_tokens": 8, "stream": True}
    async with aiohttp.ClientSession() as http:

        async def send() -> None:
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
                await r.read()

        # Until a pod's stream has shown its pace it runs at the fleet's: ties, so both are
        # tried (the picker breaks ties at random).
        for _ in range(40):
            if load.pace(fast.name) is not None and load.pace(slow.name) is not None:
                break
            await send()
        fast_pace, slow_pace = load.pace(fast.name), load.pace(slow.name)
        assert fast_pace is not None and slow_pace is not None
        assert fast_pace.tpot is not None and slow_pace.tpot is not None
        assert slow_pace.tpot > 2.0 * fast_pace.tpot
        endpoints = gw.gateway.pool.endpoints()
        scores = scorer.score(CycleState(), req("completions", body, model="sim-model"), endpoints)
        assert scores[fast.name] == 1.0 and scores[slow.name] < 0.6
        before = len(slow.pod.received)
        for _ in range(5):
            await send()
        assert len(slow.pod.received) == before  # every one to the fast pod
    assert list(load.attempts_on(fast.name)) == [] and list(load.attempts_on(slow.name)) == []
