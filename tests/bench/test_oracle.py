"""bench/harness/oracle.py: the greedy full-knowledge dispatcher on simulated pods."""

from __future__ import annotations

import dataclasses
import random
from collections import deque

import pytest

from bench import matrix
from bench.harness import costs, oracle
from heimdall_proxy.sim.engine import Engine, Seq
from heimdall_proxy.sim.options import SimOptions
from heimdall_proxy.sim.tokens import OutputWords

POD = SimOptions()  # the default pod options


def req(arrival: float, blocks: tuple[int, ...], output: int, extra: int = 1):
    """A request whose prompt is `blocks` full blocks plus `extra` tokens."""
    return oracle.OracleRequest(arrival, len(blocks) * POD.block_size + extra, output, blocks)


def test_one_request_alone_takes_the_engine_steps_by_hand() -> None:
    r = oracle.OracleRequest(0.0, 100, 3, tuple(range(6)))
    res = oracle.simulate([r], [POD])
    prefill = 0.008 + 100 * 0.00006  # one step: the whole prompt, first token at its end
    decode = [0.008 + 0.00015 + ctx * 6e-8 for ctx in (100, 101)]
    assert res.ttft == [pytest.approx(prefill)]
    assert res.e2e == [pytest.approx(prefill + sum(decode))]
    assert res.e2e[0] == pytest.approx(costs.service_time(100, 0, 3, POD))


def test_two_requests_on_one_pod_share_its_steps() -> None:
    a = oracle.OracleRequest(0.0, 100, 2, ())
    b = oracle.OracleRequest(0.0, 300, 2, ())
    res = oracle.simulate([a, b], [POD])
    step1 = 0.008 + 400 * 0.00006  # both admitted: one step prefills both prompts
    step2 = 0.008 + 2 * 0.00015 + (100 + 300) * 6e-8
    assert res.e2e == [pytest.approx(step1 + step2)] * 2
    # a third waits for a slot (FIFO)
    c = oracle.OracleRequest(0.0, 100, 1, ())
    res = oracle.simulate([a, b, c], [POD])
    assert res.ttft[2] > res.e2e[0] - 1e-12


def test_greedy_spreads_a_burst_and_follows_the_cache() -> None:
    burst = [req(0.0, (1, 2, 3), 50), req(0.0, (4, 5, 6), 50)]
    assert oracle.simulate(burst, [POD, POD]).per_pod == [1, 1]
    long = tuple(range(100, 200))  # 1,600 tokens of prefix
    warm = [req(0.0, long, 2), req(0.5, (7,), 2), req(1.0, (*long, 9), 2)]
    res = oracle.simulate(warm, [POD, POD])
    # the second goes to pod 0 (idle, ties to the lower pod), the third back to its cache
    assert res.per_pod == [3, 0]
    assert res.hit_tokens == len(long) * POD.block_size


def test_lru_hits_follow_the_trace_and_the_pods_capacity() -> None:
    small = dataclasses.replace(POD, num_gpu_blocks=4)  # an LRU of 4 blocks
    seq = [
        req(0.0, (1, 2, 3), 1),  # miss; LRU 1 2 3
        req(1.0, (1, 2, 4), 1),  # hits 1 2 (32 tokens); LRU 3 1 2 4
        req(2.0, (5, 6, 7), 1),  # miss; LRU 4 5 6 7 (3, 1, 2 evicted)
        req(3.0, (1, 2, 3), 1),  # miss: evicted; LRU 7 1 2 3
        req(4.0, (1, 2, 9), 1),  # hits 1 2 (32 tokens)
    ]
    res = oracle.simulate(seq, [small])
    assert res.hit_tokens == 64
    assert res.prompt_tokens == 5 * 49
    # a prompt of exactly its full blocks computes its last token: at most 1 block hits
    exact = [oracle.OracleRequest(0.0, 32, 1, (1, 2)), oracle.OracleRequest(1.0, 32, 1, (1, 2))]
    assert oracle.simulate(exact, [POD]).hit_tokens == 16


@pytest.mark.parametrize("loras", [(None,), (None, "lora-a", "lora-b")])
def test_decode_spans_in_closed_form_equal_step_by_step(
    monkeypatch: pytest.MonkeyPatch, loras: tuple[str | None, ...]
) -> None:
    rng = random.Random(3)
    reqs = [
        dataclasses.replace(
            req(rng.uniform(0, 3), tuple(rng.getrandbits(40) for _ in range(rng.randint(1, 40))),
                rng.randint(1, 300)),
            lora=rng.choice(loras),
        )
        for _ in range(30)
    ]  # fmt: skip
    reqs.sort(key=lambda r: r.arrival)
    fast = oracle.simulate(reqs, [POD] * 2)
    monkeypatch.setattr(oracle.Pod, "_decode_span", lambda self, limit: False)
    slow = oracle.simulate(reqs, [POD] * 2)
    assert fast.per_pod == slow.per_pod
    assert fast.e2e == pytest.approx(slow.e2e, rel=1e-9)


def _random_workload(seed: int) -> list[oracle.OracleRequest]:
    rng = random.Random(seed)
    prefixes = [tuple(rng.getrandbits(60) for _ in range(rng.randint(5, 120))) for _ in range(6)]
    out, t = [], 0.0
    for _ in range(rng.randint(30, 120)):
        t += rng.expovariate(rng.choice([2, 5, 10]))
        own = tuple(rng.getrandbits(60) for _ in range(rng.randint(1, 60)))
        out.append(req(t, rng.choice(prefixes) + own, rng.randint(1, 200), rng.randint(1, 15)))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_oracle_is_no_worse_than_round_robin_in_its_own_simulation(seed: int) -> None:
    reqs = _random_workload(seed)
    greedy = oracle.simulate(reqs, [POD] * 4)
    rr = oracle.simulate(reqs, [POD] * 4, "round_robin")
    assert greedy.mean() <= rr.mean()
    assert greedy.hit_rate >= rr.hit_rate - 0.02


@pytest.mark.slow  # simulates whole shapes: seconds of CPU
@pytest.mark.parametrize(
    "key", ["mixed", "unequal", "mooncake-conversation", "mooncake-synthetic", "shared-prefix"]
)
def test_the_oracle_beats_round_robin_on_the_lora_and_real_trace_shapes(key: str) -> None:
    shape = matrix.SHAPES[key]
    w = matrix.build_workload(shape, quick=True)
    reqs = oracle.requests_of(w)
    pods = matrix.pod_options(shape, 4)
    greedy = oracle.simulate(reqs, pods)
    rr = oracle.simulate(reqs, pods, "round_robin")
    assert greedy.mean() <= rr.mean()
    assert greedy.p95() <= rr.p95()
    assert greedy.hit_rate >= rr.hit_rate
    bound, _ = matrix.bounds(shape, w, 4)
    assert greedy.total >= bound.cached - 1e-6  # the bound is one


def test_pod_options_read_the_shapes_flags() -> None:
    slow = matrix.pod_options(matrix.SHAPES["unequal"], 4)
    assert [o.step_base for o in slow] == [0.008, 0.008, 0.016, 0.016]
    assert matrix.pod_options(matrix.SHAPES["cold-burst"], 1)[0].num_gpu_blocks == 1024


# ---- LoRA adapters ----------------------------------------------------------------------

ADAPTERS = ["lora-a", "lora-b", "lora-c"]


def _engine_run(
    prompts: list[tuple[float, list[int], int, str]], options: SimOptions
) -> tuple[list[float], list[float], int]:
    """The simulator's own engine (sim/engine.py) stepped in virtual time: each step
    scheduled by the engine and lasting its cost model's time, arrivals joining at the first
    step that starts at or after them. (ttft, e2e) per request and the prefix hits."""
    eng = Engine(options)
    seqs = []
    for i, (arrival, ids, output, model) in enumerate(prompts):
        lora = model if model != options.model else None
        lora_id = options.lora_modules.index(model) + 1 if lora else None
        s = Seq(f"r{i}", ids, output, OutputWords(None, None, ids), lora=lora, lora_id=lora_id)
        s.arrival = arrival
        seqs.append(s)
    pending = deque(sorted(seqs, key=lambda s: s.arrival))
    o, clock = options, 0.0
    while pending or eng.waiting or eng.running:
        while pending and pending[0].arrival <= clock:
            eng.waiting.append(pending.popleft())
        if not eng.waiting and not eng.running:
            clock = pending[0].arrival
            continue
        plan = eng._schedule(clock)
        assert plan.items and not eng.stats.preemptions  # the oracle leaves preemption out
        clock += (
            o.step_base
            + o.prefill_cost_per_token * plan.prefill_tokens
            + o.decode_cost_per_seq * plan.decode_seqs
            + o.kv_read_cost_per_token * plan.context_tokens
            + plan.extra
        )
        eng._complete(plan, clock)
    ttft = [s.first_token_at - s.arrival for s in seqs]  # type: ignore[operator]
    e2e = [s.finished_at - s.arrival for s in seqs]  # type: ignore[operator]
    return ttft, e2e, eng.stats.prefix_hits


def _lora_prompts(seed: int, models: list[str]) -> list[tuple[float, list[int], int, str]]:
    """Requests on the base model and adapters, sharing prefixes (across models too), in
    bursts that queue behind a pod's two slots."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(20, 300))] for _ in range(4)]
    out, t = [], 0.0
    for _ in range(40):
        t += rng.expovariate(8.0)
        ids = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randint(1, 200))]
        out.append((t, ids, rng.randint(1, 60), rng.choice(models)))
    return out


@pytest.mark.parametrize(("seed", "max_loras"), [(0, 1), (1, 1), (2, 2), (3, 2)])
def test_one_pods_timeline_is_the_engines_with_lora_adapters(seed: int, max_loras: int) -> None:
    o = SimOptions(lora_modules=list(ADAPTERS), max_loras=max_loras, max_num_seqs=costs.SLOTS)
    prompts = _lora_prompts(seed, [o.model, *ADAPTERS])
    reqs = [
        oracle.OracleRequest(
            t, len(ids), out, oracle.block_keys(ids, m, o.block_size),
            m if m != o.model else None,
        )
        for t, ids, out, m in prompts
    ]  # fmt: skip
    res = oracle.simulate(reqs, [o])
    ttft, e2e, hits = _engine_run(prompts, o)
    assert res.ttft == pytest.approx(ttft, rel=1e-9)
    assert res.e2e == pytest.approx(e2e, rel=1e-9)
    assert res.hit_tokens == hits


def test_requests_of_reads_the_adapter_from_the_model() -> None:
    w = matrix.build_workload(matrix.SHAPES["mixed"], quick=True)
    reqs = oracle.requests_of(w)
    assert {r.lora for r in reqs} == {None, "lora-a", "lora-b"}
    assert [r.lora or SimOptions().model for r in reqs] == [r.body["model"] for r in w.requests]
    assert [o.max_loras for o in matrix.pod_options(matrix.SHAPES["mixed"], 2)] == [1, 1]


def lreq(arrival: float, block: int, output: int, lora: str) -> oracle.OracleRequest:
    return oracle.OracleRequest(arrival, POD.block_size + 1, output, (block,), lora)


def test_greedy_keeps_an_adapters_requests_together_when_a_swap_costs_more() -> None:
    pod = dataclasses.replace(POD, lora_modules=["lora-a", "lora-b"], max_loras=1)
    trace = [
        lreq(0.0, 1, 200, "lora-a"),  # pod 0 decodes it until ~1.7 s
        lreq(0.0, 2, 2, "lora-b"),  # lora-a holds pod 0's adapter slot: pod 1, lora-b loaded
        lreq(0.5, 3, 20, "lora-a"),  # pod 0's free slot, no load, beats idle pod 1's 0.2 s load
        lreq(0.55, 4, 2, "lora-a"),  # pod 0 is full for ~0.12 s: waiting beats the load
    ]
    assert oracle.simulate(trace, [pod, pod]).per_pod == [3, 1]
    # the same with loads free: the third goes to idle pod 1, swapping lora-b out
    free = dataclasses.replace(pod, lora_load_time=0.0)
    assert oracle.simulate(trace, [free, free]).per_pod == [2, 2]


def test_a_request_whose_adapter_waits_lets_the_requests_behind_it_go_first() -> None:
    pod = dataclasses.replace(POD, lora_modules=["lora-a", "lora-b"], max_loras=1)
    trace = [
        lreq(0.0, 1, 100, "lora-a"),  # loads lora-a (0.2 s), holds the only adapter slot
        lreq(0.01, 2, 5, "lora-b"),  # waits for it to end
        oracle.OracleRequest(0.02, 17, 5, (3,)),  # the base model: the free slot at 0.21 s
    ]
    res = oracle.simulate(trace, [pod])
    assert 0.02 + res.e2e[2] < 0.3
    assert 0.01 + res.ttft[1] > res.e2e[0] + 0.2  # lora-a ends, then lora-b loads
    # lora-b's first step loads it
    alone = oracle.simulate([lreq(0.0, 2, 1, "lora-b")], [pod])
    assert alone.e2e[0] == pytest.approx(0.008 + 17 * 0.00006 + 0.2)
