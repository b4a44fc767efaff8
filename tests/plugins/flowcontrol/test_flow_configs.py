"""llm-d-router's admission and flow-control configs (tests/fixtures/llm_d: the probabilistic
admitter, program-aware fairness, the soft reflective ceiling): check-config accepts each,
each builds the flow control it asks for, and each serves requests on simulated pods with
its policy at work."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from heimdall_proxy.cli.main import main
from heimdall_proxy.config.gateway import parse_config
from heimdall_proxy.plugins.flowcontrol.program_aware import ProgramAwareFairness
from heimdall_proxy.plugins.flowcontrol.usage_limits.soft_reflective_ceiling import (
    SoftReflectiveCeiling,
)
from heimdall_proxy.plugins.requestcontrol.admitters.probabilistic import ProbabilisticAdmitter
from tests.conftest import GatewayFactory, PodFactory, RunningPod

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm_d"
ADMITTER = FIXTURES / "probabilistic-admitter-epp-config.yaml"
PROGRAM_AWARE = FIXTURES / "sim-program-aware-config.yaml"
CEILING = FIXTURES / "soft-reflective-ceiling-epp-config.yaml"
CONFIGS = [ADMITTER, PROGRAM_AWARE, CEILING]
OBJECTIVES = [{"name": "gold", "priority": 10}, {"name": "batch", "priority": -1}]


def on_pods(path: Path, pods: list[RunningPod], **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["endpoints"] = [{"name": p.name, "url": p.url} for p in pods]
    doc["objectives"] = OBJECTIVES  # the InferenceObjectives of a cluster
    doc.update(extra)
    return doc


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_check_config_accepts_them(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(path)]) == 0
    _, err = capsys.readouterr()
    # the admitter's config sets only flowControl.saturationDetector, used without the gate
    assert "feature gate is off" not in err


async def test_each_builds_the_flow_control_it_asks_for(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod()]
    gw = await start_gateway(parse_config(on_pods(ADMITTER, pods)))
    assert [type(a) for a in gw.gateway.routing.director.admission.admitters] == [
        ProbabilisticAdmitter
    ]
    assert not gw.gateway.flow.queues  # no flowControl gate: the admitter alone sheds
    gw = await start_gateway(parse_config(on_pods(CEILING, pods)))
    assert isinstance(gw.gateway.flow.usage_limit, SoftReflectiveCeiling)
    gw = await start_gateway(parse_config(on_pods(PROGRAM_AWARE, pods)))
    band = gw.gateway.flow._band(0)
    assert isinstance(band.fairness, ProgramAwareFairness)


async def post(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None, **body: Any
) -> tuple[int, dict[str, Any]]:
    payload = {"model": "sim-model", "prompt": "hello " * 20, "max_tokens": 4, **body}
    async with http.post(f"{url}/v1/completions", json=payload, headers=headers or {}) as r:
        return r.status, await r.json()


@pytest.mark.slow
async def test_the_admitter_sheds_sheddable_requests_from_a_loaded_pool(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # one request at a time, at GPU speed: a few long requests fill each pod's queue
    pods = [await start_pod(max_num_seqs=1, time_scale=1.0) for _ in range(2)]
    gw = await start_gateway(parse_config(on_pods(ADMITTER, pods)))
    batch = {"x-gateway-inference-objective": "batch"}
    async with aiohttp.ClientSession() as http:
        status, _ = await post(http, gw.url, batch)
        assert status == 200  # an idle pool: load 0, nothing shed
        load = [asyncio.create_task(post(http, gw.url, max_tokens=400)) for _ in range(14)]
        admitter = gw.gateway.plugins.plugins["probabilistic-admitter"]
        assert isinstance(admitter, ProbabilisticAdmitter)
        pods_now = list(gw.gateway.pool.endpoints())
        for _ in range(300):  # until the scrapes show queues past the certain-shed point
            if admitter.load(pods_now) >= 0.5:  # refused with probability 1 from ~0.32
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError([e.metrics for e in pods_now])
        status, answer = await post(http, gw.url, batch)
        assert status == 429 and answer["error"]["code"] == "pool_saturated"
        assert "sheddable" in answer["error"]["message"]
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)


@pytest.mark.slow
async def test_program_aware_fairness_follows_each_programs_service(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(2)]
    doc = on_pods(PROGRAM_AWARE, pods)
    doc["plugins"].append({"type": "agent-identity"})  # sessions as programs
    gw = await start_gateway(parse_config(doc))
    policy = gw.gateway.plugins.plugins["program-aware-fairness"]
    assert isinstance(policy, ProgramAwareFairness)
    async with aiohttp.ClientSession() as http:
        for headers in (
            {"x-llm-d-inference-fairness-id": "tenant-a"},
            {"x-claude-code-session-id": "session-1"},
            {},
        ):
            status, _ = await post(http, gw.url, headers)
            assert status == 200
        async with http.get(f"{gw.url}/metrics") as r:
            text = await r.text()
    assert set(policy.programs) == {"tenant-a", "session-1", "default-flow"}
    assert all(p.service > 0 and p.in_flight == 0 for p in policy.programs.values())
    assert 'llm_d_epp_program_aware_attained_service_tokens{program_id="session-1"}' in text
    assert "llm_d_epp_program_aware_jains_fairness_index 1.0" in text


@pytest.mark.slow
async def test_the_soft_ceiling_config_serves_every_priority(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(2)]
    gw = await start_gateway(parse_config(on_pods(CEILING, pods)))
    async with aiohttp.ClientSession() as http:
        for objective in ("gold", "", "batch"):
            headers = {"x-gateway-inference-objective": objective} if objective else {}
            results = await asyncio.gather(*(post(http, gw.url, headers) for _ in range(4)))
            assert [s for s, _ in results] == [200] * 4
    # the bands seen are the policy's priorities, highest first
    assert gw.gateway.flow._priorities == [10, 0, -1]
