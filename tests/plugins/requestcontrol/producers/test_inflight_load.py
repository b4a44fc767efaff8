"""inflight-load-producer and token-load-scorer (llm-d's): one ledger per gateway, fed by the
relay, read by the scorers; llm-d's configs for them load here unchanged."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import yaml

from heimdall_proxy.cli.main import main
from heimdall_proxy.config.gateway import ConfigError
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.token_load import TokenLoadParams, TokenLoadScorer
from heimdall_proxy.server.app import create_app
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config
from tests.helpers import ep
from tests.plugins.helpers import req

#: As llm-d's router configs write them (names and parameters).
LLMD = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [
        {
            "type": "inflight-load-producer",
            "name": "inflight-load",
            "parameters": {"addEstimatedOutputTokens": True, "maxEstimatedOutputTokens": 50},
        },
        {"type": "token-load-scorer", "parameters": {"queueThresholdTokens": 1000}},
        {"type": "active-request-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "token-load-scorer", "weight": 2},
                {"pluginRef": "active-request-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}


def test_token_load_scores_the_ledgers_tokens_against_the_threshold() -> None:
    handle = PluginHandle(EndpointPool([]))
    scorer = TokenLoadScorer("t", TokenLoadParams(queueThresholdTokens=1000), handle)
    assert handle.load.count_tokens  # the relay now estimates tokens for the ledger
    handle.load.acquire("r:0", "a", prompt=250)
    handle.load.acquire("s:0", "b", prompt=900, output=300)
    got = scorer.score(CycleState(), req(), [ep("a"), ep("b"), ep("c")])
    assert got == {"a": 0.75, "b": 0.0, "c": 1.0}
    default = TokenLoadScorer("d", TokenLoadParams(queueThresholdTokens=0), handle)
    assert default.score(CycleState(), req(), [ep("a")])["a"] == 1.0 - 250 / 4_194_304


async def test_the_ledger_follows_a_stream_and_both_scorers_read_it(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod(), await start_pod()]
    hold = asyncio.Event()
    for p in pods:
        p.pod.hold = hold
    gw = await start_gateway(make_config(pods, LLMD))
    load = gw.gateway.load
    body = {"model": "sim-model", "prompt": "word " * 200, "max_tokens": 80, "stream": True}
    async with aiohttp.ClientSession() as http:
        first = await http.post(f"{gw.url}/v1/completions", json=body)
        await first.content.readuntil(b"\n\n")  # its first chunk: the prompt has left
        busy = first.headers["x-sim-pod"]
        assert load.requests == {busy: 1}
        assert load.tokens == {busy: 50}  # the output estimate stays, capped at 50
        second = await http.post(f"{gw.url}/v1/completions", json=body)
        await second.content.readuntil(b"\n\n")
        assert second.headers["x-sim-pod"] != busy  # the loaded pod scored lower
        hold.set()
        for r in (first, second):
            await r.read()
            r.release()
    await eventually(lambda: load.requests == {} and load.tokens == {})


def test_llmd_configs_with_the_producer_load_and_two_producers_do_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "llmd.yaml"
    cfg.write_text(yaml.safe_dump({**LLMD, "endpoints": [{"name": "a", "url": "http://h:1"}]}))
    assert main(["check-config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "inflight-load (type inflight-load-producer): LoadEstimator" in out
    twice = {**LLMD, "plugins": [*LLMD["plugins"], {"type": "inflight-load-producer"}]}
    with pytest.raises(ConfigError, match="more than one inflight-load-producer"):
        create_app(make_config([], twice))


async def test_llm_d_gauges_follow_a_request_in_flight(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    pod.pod.hold = asyncio.Event()
    doc = {"plugins": [{"type": "inflight-load-producer"}, {"type": "token-load-scorer"},
                       {"type": "max-score-picker"}]}  # fmt: skip
    gw = await start_gateway(make_config([pod], doc))
    labels = {"endpoint_name": pod.name, "namespace": "", "fairness_id": "", "priority": "",
              "producer_name": "inflight-load-producer"}  # fmt: skip
    assert gw.metric("llm_d_epp_inflight_requests", labels) == 0
    body = {"model": "sim-model", "prompt": "tell me a story " * 40, "max_tokens": 3,
            "stream": True}  # fmt: skip
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            await eventually(lambda: gw.metric("llm_d_epp_inflight_requests", labels) == 1)
            tokens = gw.metric("llm_d_epp_inflight_tokens", labels)
            assert tokens is not None and tokens > 100  # the prompt, before its first chunk
            pod.pod.hold.set()
            await r.read()
    await eventually(lambda: gw.metric("llm_d_epp_inflight_requests", labels) == 0)
    assert gw.metric("llm_d_epp_inflight_tokens", labels) == 0
