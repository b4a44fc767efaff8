"""Passive outlier ejection: a failing pod leaves the candidates, comes back on trial, and
every pod is a candidate again when all are ejected."""

from __future__ import annotations

import aiohttp
import pytest

from heimdall_proxy.config.gateway import OutlierDetectionConfig
from heimdall_proxy.resilience.outliers import OutlierDetector, Verdicts
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config
from tests.helpers import ep

PODS = [ep("a"), ep("b")]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def detector(clock: Clock, **cfg: object) -> OutlierDetector:
    return OutlierDetector(OutlierDetectionConfig.model_validate(cfg), clock=clock)


def names(eps: list[object]) -> list[str]:
    return [e.name for e in eps]  # type: ignore[attr-defined]


def test_ejection_grows_with_repeats_and_a_success_on_trial_resets_it() -> None:
    clock = Clock()
    d = detector(clock, consecutiveFailures=3, baseEjectionTime="10s", maxEjectionTime="25s")
    d.failure("a")
    d.failure("a")
    d.success("a")  # a success breaks the run
    d.failure("a")
    d.failure("a")
    assert names(d.filter(PODS)) == ["a", "b"]
    d.failure("a")
    assert names(d.filter(PODS)) == ["b"]
    clock.now = 10.0
    assert names(d.filter(PODS)) == ["a", "b"]  # back, on trial
    d.failure("a")  # one failure on trial ejects again, for twice as long
    clock.now = 29.0
    assert names(d.filter(PODS)) == ["b"]
    clock.now = 30.0
    d.failure("a")
    clock.now = 30.0 + 25.0 - 0.1  # capped at maxEjectionTime
    assert names(d.filter(PODS)) == ["b"]
    clock.now = 60.0
    d.success("a")  # the trial succeeded: the next ejection starts from the base again
    for _ in range(3):
        d.failure("a")
    clock.now = 60.0 + 10.0
    assert names(d.filter(PODS)) == ["a", "b"]


def test_panic_mode_and_off() -> None:
    clock = Clock()
    d = detector(clock, consecutiveFailures=1)
    d.failure("a")
    d.failure("b")
    assert names(d.filter(PODS)) == ["a", "b"]  # all ejected: none is
    off = detector(clock, consecutiveFailures=0)
    for _ in range(10):
        off.failure("a")
    assert names(off.filter(PODS)) == ["a", "b"]


@pytest.mark.parametrize("status", [503, 500])
async def test_a_failing_pod_is_ejected_and_no_request_is_lost(
    start_pod: PodFactory, start_gateway: GatewayFactory, status: int
) -> None:
    """A 503 counts at once; a 500 counts because the next pod served the same request."""
    bad, good = await start_pod(), await start_pod()
    bad.pod.fail_status = status
    good.pod.metrics_override = {"waiting": 10}  # queue scoring prefers the failing pod
    cfg = make_config([bad, good])
    cfg = cfg.model_copy(
        update={"outlier_detection": OutlierDetectionConfig(consecutiveFailures=2)}
    )
    gw = await start_gateway(cfg)
    await eventually(lambda: gw.gateway.pool.get(good.name).metrics.waiting == 10)
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        for _ in range(6):
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
    assert len(bad.pod.received) == 2  # ejected after its second failure
    assert len(good.pod.received) == 6
    assert gw.metric("inference_objective_pod_ejections_total", {"pod": bad.name}) == 1


async def test_a_pod_whose_engine_is_stuck_but_metrics_answer_leaves_rotation(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    stuck, good = await start_pod(), await start_pod()
    gw = await start_gateway(make_config([stuck, good]), health_interval=0.05)
    stuck.pod.health_status = 503  # /metrics still answers 200
    await eventually(lambda: not gw.gateway.pool.get(stuck.name).healthy)
    assert gw.gateway.pool.get(stuck.name).scrape_ok  # only the health check caught it
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        for _ in range(4):
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
    assert stuck.pod.received == [] and len(good.pod.received) == 4
    stuck.pod.health_status = None  # one good check brings it back
    await eventually(lambda: gw.gateway.pool.get(stuck.name).healthy)


def test_a_500_counts_only_once_another_pod_served_the_request() -> None:
    clock = Clock()
    d = detector(clock, consecutiveFailures=1)
    first = Verdicts(d)
    assert not first.answered("a", 500)  # held: whose fault is not known yet
    assert names(d.filter(PODS)) == ["a", "b"]
    assert not first.answered("b", 200)  # b served it: a's 500 was a's
    assert names(d.filter(PODS)) == ["b"]
    clock.now = 100.0
    again = Verdicts(d)
    assert not again.answered("b", 500)
    assert again.answered("a", 500)  # the same request failed on two pods: its own fault
    assert names(d.filter(PODS)) == ["a", "b"]
    bad_input = Verdicts(d)
    assert not bad_input.answered("a", 500)
    assert not bad_input.answered("b", 400)  # a 4xx elsewhere: the request was at fault
    assert names(d.filter(PODS)) == ["a", "b"]
    for status in (503, 429):  # overload and unavailability are the pod's, at once
        clock.now += 1000.0
        assert not Verdicts(d).answered("a", status)
        assert names(d.filter(PODS)) == ["b"]


async def test_a_request_that_fails_on_two_pods_is_answered_and_ejects_no_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """A body that makes every pod answer 500 (vLLM's handler failing on it) stops after two
    pods, reaches the client as the pod answered it, and takes no pod out of rotation, so a
    client cannot empty the pool by repeating it."""
    pods = [await start_pod() for _ in range(3)]
    cfg = make_config(pods)
    cfg = cfg.model_copy(
        update={"outlier_detection": OutlierDetectionConfig(consecutiveFailures=1)}
    )
    gw = await start_gateway(cfg, trust_client_transfer_params=True, max_attempts=3)
    poison = {"model": "sim-model", "prompt": "hi", "max_tokens": 1, "kv_transfer_params": "x"}
    good = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(f"{gw.url}/v1/completions", json=poison) as r:
                assert r.status == 500
                assert "kv_transfer_params" in (await r.json())["error"]["message"]
        assert sum(len(p.pod.received) for p in pods) == 6  # two pods each, not three
        for _ in range(6):
            async with http.post(f"{gw.url}/v1/completions", json=good) as r:
                assert r.status == 200
    assert not gw.gateway.outliers.any_ejected
    for p in pods:
        assert not gw.metric("inference_objective_pod_ejections_total", {"pod": p.name})
    assert gw.metric("inference_objective_retries_total", {"reason": "500"}) == 3
