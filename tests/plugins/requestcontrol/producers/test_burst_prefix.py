"""burst-prefix-cache-producer: the requests of one window placed jointly, re-deriving the
README's behaviour: identical samples go together (up to maxPerReplica a replica), distinct
groups are balanced, a lone request gets no affinity unless minColocateBlocks lets it join a
prefix it shares, within the window's fair share; prefix-cache-scorer reads the result."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.requestcontrol.producers.burst_prefix import (
    BurstPrefixCacheProducer,
    BurstPrefixParams,
)
from heimdall_proxy.plugins.scheduling.scorers.prefix_cache import (
    PrefixCacheParams,
    PrefixCacheScorer,
)
from tests.conftest import GatewayFactory, PodFactory, make_config
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

BLOCK = 4


def producer(**params: Any) -> BurstPrefixCacheProducer:
    p = BurstPrefixParams.model_validate(
        {"blockSizeTokens": BLOCK, "windowDurationMs": 20, **params}
    )
    return BurstPrefixCacheProducer("burst-prefix-cache-producer", p, ledger())


def prompt(tokens: list[int]) -> InferenceRequest:
    r = req("completions", {"prompt": "x"})
    r.token_ids = tokens
    return r


def tokens(start: int, blocks: int = 4) -> list[int]:
    return list(range(start, start + blocks * BLOCK))


async def window(
    plugin: BurstPrefixCacheProducer, prompts: list[list[int]], pods: list[Endpoint]
) -> list[str | None]:
    """Produce for every prompt at once (one window); each one's replica (None: none)."""
    states = [CycleState() for _ in prompts]
    await asyncio.gather(
        *(plugin.produce(s, prompt(t), pods) for s, t in zip(states, prompts, strict=True))
    )
    out: list[str | None] = []
    for s in states:
        info = s[plugin.state_key]
        assert isinstance(info, PrefixCacheMatchInfo)
        placed = [pod for pod, n in info.matched_blocks.items() if n == info.total_blocks > 0]
        out.append(placed[0] if placed else None)
    return out


PODS = [ep("a"), ep("b"), ep("c")]


async def test_a_group_goes_to_one_replica_and_groups_are_balanced() -> None:
    p1, p2 = tokens(0), tokens(1000)
    got = await window(producer(), [p1, p2, p1, p1, p2, p1], PODS[:2])
    first = {got[i] for i in (0, 2, 3, 5)}
    second = {got[i] for i in (1, 4)}
    assert len(first) == 1 and len(second) == 1 and first != second


async def test_max_per_replica_spills_a_group_to_the_least_loaded() -> None:
    p1 = tokens(0)
    got = await window(producer(maxPerReplica=2), [p1] * 5, PODS)
    assert sorted(got.count(pod) for pod in ("a", "b", "c")) == [1, 2, 2]


async def test_a_lone_request_or_a_short_prompt_gets_no_affinity() -> None:
    got = await window(producer(), [tokens(0), tokens(500), [1, 2]], PODS)
    assert got == [None, None, None]


async def test_min_colocate_blocks_joins_a_shared_prefix_within_fair_share() -> None:
    x, y = tokens(0, 4), tokens(1000, 4)
    z = x[: 2 * BLOCK] + list(range(5000, 5000 + 2 * BLOCK))  # shares x's first 2 blocks
    prompts = [x, x, y, y, z]
    assert (await window(producer(), prompts, PODS[:2]))[4] is None  # 0: identical only
    got = await window(producer(minColocateBlocks=2), prompts, PODS[:2])
    assert got[4] == got[0] != got[2]  # fair share 3 of 5: z joins x's replica
    # a lone request sharing fewer blocks than asked for stays unplaced
    assert (await window(producer(minColocateBlocks=3), prompts, PODS[:2]))[4] is None


async def test_windows_are_apart_and_a_full_window_gives_no_affinity() -> None:
    plugin = producer(maxBatchSize=2)
    p1 = tokens(0)
    got = await window(plugin, [p1, p1, p1], PODS[:2])
    assert got[0] == got[1] is not None and got[2] is None  # the third found it full
    again = await window(plugin, [p1, p1], PODS[:2])  # a new window
    assert again[0] == again[1] is not None


async def test_prefix_cache_scorer_reads_it_by_name() -> None:
    plugin = producer()
    scorer = PrefixCacheScorer(
        "prefix-cache-scorer",
        PrefixCacheParams.model_validate(
            {"prefixMatchInfoProducerName": "burst-prefix-cache-producer"}
        ),
        ledger(),
    )
    states = [CycleState(), CycleState()]
    r = prompt(tokens(0))
    await asyncio.gather(*(plugin.produce(s, r, PODS[:2]) for s in states))
    scores = scorer.score(states[0], r, PODS[:2])
    assert sorted(scores.get(p.name, 0.0) for p in PODS[:2]) == [0.0, 1.0]


async def test_tokens_balancing_discounts_blocks_already_placed() -> None:
    # two groups with a long shared head: under token balancing the second pays only its
    # distinct tail on the first's replica, so with minColocateBlocks it follows it there
    head = tokens(0, 6)
    x, y = head + tokens(900, 1), head + tokens(1900, 1)
    long_other = tokens(5000, 8)
    got = await window(
        producer(minColocateBlocks=6, balanceBy="tokens"),
        [x, x, y, y, long_other, long_other],
        PODS[:2],
    )
    assert got[0] == got[2] != got[4]


@pytest.mark.parametrize(
    "params",
    [
        {"windowDurationMs": 0},
        {"windowDurationMs": 10001},
        {"maxPerReplica": 0},
        {"maxBatchSize": 0},
        {"blockSizeTokens": 64, "maxPrefixTokensToMatch": 32},
        {"balanceBy": "bytes"},
    ],
)
def test_invalid_parameters_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BurstPrefixParams.model_validate(params)


def test_defaults_are_llm_ds() -> None:
    p = BurstPrefixParams()
    assert (
        p.window_duration_ms,
        p.max_per_replica,
        p.block_size_tokens,
        p.max_prefix_tokens_to_match,
        p.min_colocate_blocks,
        p.max_batch_size,
        p.balance_by,
    ) == (100, -1, 64, 0, 0, 1000, "requests")
    assert p.max_blocks() == 2048


async def test_through_a_gateway_a_burst_lands_together(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    epp = {
        "plugins": [
            {"type": "burst-prefix-cache-producer", "parameters": {"windowDurationMs": 200}},
            {
                "type": "prefix-cache-scorer",
                "parameters": {"prefixMatchInfoProducerName": "burst-prefix-cache-producer"},
            },
            {"type": "max-score-picker"},
        ]
    }
    pods = [await start_pod(), await start_pod(), await start_pod()]
    gw = await start_gateway(make_config(pods, epp))

    async def send(http: aiohttp.ClientSession, text: str) -> str:
        body = {"model": "sim-model", "prompt": text, "max_tokens": 1}
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            assert r.status == 200
            await r.read()
            return r.headers["x-sim-pod"]

    group_a, group_b = "rollout prompt A " * 80, "another prompt B " * 80
    async with aiohttp.ClientSession() as http:
        served = await asyncio.gather(*(send(http, t) for t in [group_a] * 4 + [group_b] * 4))
    assert len(set(served[:4])) == 1 and len(set(served[4:])) == 1
    assert served[0] != served[4]
