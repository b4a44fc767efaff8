"""program-aware-fairness: least attained service between programs, the head wait as the
tie-breaker, decay by half-life, idle programs forgotten, its metrics; and, in a queue, a
program that consumed much yielding to one that consumed little."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import ValidationError

from heimdall_proxy.framework.flowcontrol import FlowHead
from heimdall_proxy.framework.types import InferenceRequest
from heimdall_proxy.plugins.flowcontrol.program_aware import (
    ProgramAwareFairness,
    ProgramAwareParams,
    jains_index,
)
from tests.flowcontrol.harness import controller, hold, release_order, request
from tests.helpers import ep
from tests.plugins.helpers import ctx, ledger, req


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(**params: Any) -> tuple[ProgramAwareFairness, Clock]:
    plugin = ProgramAwareFairness("pa", ProgramAwareParams.model_validate(params), ledger())
    clock = plugin.clock = Clock()
    plugin._last_sweep = clock.now
    return plugin, clock


def head(program: str, enqueued: float) -> FlowHead:
    r = req()
    r.fairness_id = program
    return FlowHead(f"{program}\x00m", 0.0, program, enqueued, 1, r)


async def complete(
    plugin: ProgramAwareFairness, program: str, prompt: int, output: int
) -> InferenceRequest:
    r = req()
    r.fairness_id = program
    c = ctx(r, ep("pod"))
    await plugin.pre_request(c)
    c.prompt_tokens, c.output_tokens = prompt, output
    await plugin.response_complete(c)
    return r


def test_defaults() -> None:
    p = ProgramAwareParams()
    assert p.strategy == "las"
    assert (p.eviction_ttl_seconds, p.eviction_sweep_seconds) == (3600, 300)
    assert (p.las_weight_service, p.las_weight_head_wait, p.las_half_life_seconds) == (
        0.8,
        0.2,
        60,
    )


@pytest.mark.parametrize(
    "params",
    [
        {"strategy": "wfq"},
        {"evictionSweepSeconds": 0},
        {"evictionTtlSeconds": -1},
        {"lasWeightService": -1},
        {"lasHalfLifeSeconds": -1},
    ],
)
def test_llm_ds_invalid_configs_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ProgramAwareParams.model_validate(params)


async def test_the_program_with_less_service_goes_first() -> None:
    plugin, clock = make(lasWeightService=1.0, lasWeightHeadWait=0.0)
    await complete(plugin, "alpha", 1000, 0)
    await complete(plugin, "beta", 10, 0)
    flows = [head("alpha", clock.now - 5), head("beta", clock.now)]
    assert plugin.pick_flow(flows, None) == 1


async def test_an_output_token_costs_two_prompt_tokens() -> None:
    plugin, _ = make(lasHalfLifeSeconds=0)
    await complete(plugin, "alpha", 100, 50)
    assert plugin.programs["alpha"].service == 200


def test_on_a_cold_start_the_older_head_wins() -> None:
    plugin, clock = make(lasWeightService=1.0, lasWeightHeadWait=1.0)
    flows = [head("beta", clock.now - 0.1), head("alpha", clock.now - 1.0)]
    assert plugin.pick_flow(flows, None) == 1


async def test_service_halves_every_half_life_so_an_idle_program_comes_back() -> None:
    plugin, clock = make(lasWeightService=1.0, lasWeightHeadWait=0.0, lasHalfLifeSeconds=1)
    await complete(plugin, "alpha", 1000, 0)
    clock.now += 1.0
    assert plugin.service(plugin.programs["alpha"], clock.now) == pytest.approx(500)
    clock.now += 9.0  # ten half-lives in all: ~1 left
    await complete(plugin, "beta", 10, 0)
    assert plugin.pick_flow([head("beta", clock.now), head("alpha", clock.now)], None) == 1
    # a completion folds the decay in before adding
    clock.now += 1.0
    await complete(plugin, "beta", 0, 0)
    assert plugin.programs["beta"].service == pytest.approx(5)


async def test_a_zero_half_life_keeps_service() -> None:
    plugin, clock = make(lasHalfLifeSeconds=0)
    await complete(plugin, "alpha", 100, 0)
    clock.now += 1e6
    assert plugin.service(plugin.programs["alpha"], clock.now) == 100


async def test_idle_programs_are_forgotten_busy_ones_kept() -> None:
    plugin, clock = make(evictionTtlSeconds=10, evictionSweepSeconds=5)
    await complete(plugin, "idle", 1, 1)
    busy = req()
    busy.fairness_id = "busy"
    await plugin.pre_request(ctx(busy, ep("pod")))  # in flight, never completes
    clock.now += 11
    plugin.pick_flow([head("other", clock.now)], None)  # a sweep is due
    assert set(plugin.programs) == {"busy", "other"}


async def test_waits_and_jains_index() -> None:
    assert jains_index([]) == 1.0 and jains_index([3.0]) == 1.0
    assert jains_index([2.0, 2.0]) == 1.0
    assert jains_index([1.0, 0.0]) == pytest.approx(0.5)
    plugin, clock = make()
    # alpha waited 100 ms in the queue; beta went straight through (a wait of 0)
    flows = [head("alpha", clock.now - 0.1)]
    plugin.pick_flow(flows, None)
    c = ctx(flows[0].request, ep("pod"))
    await plugin.pre_request(c)
    await complete(plugin, "beta", 10, 5)
    assert plugin.programs["alpha"].mean_wait_ms == pytest.approx(100)
    assert plugin.programs["beta"].mean_wait_ms == 0
    assert plugin.fairness_index() == pytest.approx(0.5)
    registry = CollectorRegistry()

    class Source:
        def collect(self) -> Any:
            return plugin.collect_metrics()

    registry.register(Source())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert "llm_d_epp_program_aware_jains_fairness_index 0.5" in text
    assert 'llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id="alpha"} 100' in text
    assert 'llm_d_epp_program_aware_attained_service_tokens{program_id="beta"} 20.0' in text
    assert 'attained_service_tokens{program_id="alpha"}' not in text  # no completion yet


async def test_in_a_queue_the_heavy_program_yields_to_the_light_one() -> None:
    plugin, _ = make()
    plugin.clock = time.monotonic  # the queue's clock
    await complete(plugin, "heavy", 5000, 5000)
    await complete(plugin, "light", 10, 10)
    fc = controller(fairness=plugin)
    hold(fc, 1)
    ids = {"x-llm-d-inference-fairness-id"}

    def of(program: str) -> InferenceRequest:
        return request(headers=dict.fromkeys(ids, program))

    labelled = [("heavy-1", of("heavy")), ("heavy-2", of("heavy")), ("light-1", of("light"))]
    # global strict would keep arrival order: heavy-1, heavy-2, light-1
    order = await release_order(fc, labelled, held=1)
    assert order[0] == "light-1"
