"""no-hit-lru-scorer: cold requests rotate over pods by LRU, hot requests score 0.5."""

from __future__ import annotations

import random

import pytest

from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.no_hit_lru import NoHitLRUParams, NoHitLRUScorer
from tests.helpers import ep
from tests.plugins.helpers import ctx, req

PODS = [ep("a"), ep("b"), ep("c")]


def make(**params: object) -> NoHitLRUScorer:
    return NoHitLRUScorer("n", NoHitLRUParams.model_validate(params), None)  # type: ignore[arg-type]


def state_with(
    matched: dict[str, float],
    key: str = "approx-prefix-cache-producer/approx-prefix-cache-producer",
) -> CycleState:
    state = CycleState()
    state[key] = PrefixCacheMatchInfo(16, 10, 160, matched)
    return state


async def send_cold(scorer: NoHitLRUScorer, pod_index: int) -> None:
    c = ctx(req(), PODS[pod_index])
    c.state.update(state_with({}))
    scorer.score(c.state, c.request, PODS)
    await scorer.pre_request(c)


def test_defaults() -> None:
    p = NoHitLRUParams()
    assert (p.prefix_plugin_type, p.prefix_plugin_name, p.lru_size) == (
        "prefix-cache-scorer",
        "prefix-cache-scorer",
        1024,
    )


async def test_cold_requests_prefer_never_used_then_least_recently_used() -> None:
    scorer = make()
    assert scorer.score(state_with({}), req(), PODS) == {"a": 1.0, "b": 0.5, "c": 0.0}
    await send_cold(scorer, 0)  # a used
    assert scorer.score(state_with({}), req(), PODS) == {"b": 1.0, "c": 0.5, "a": 0.0}
    await send_cold(scorer, 2)  # then c
    assert scorer.score(state_with({}), req(), PODS) == {"b": 1.0, "a": 0.5, "c": 0.0}
    await send_cold(scorer, 1)
    await send_cold(scorer, 0)
    assert scorer.last_used() == ["c", "b", "a"]
    assert scorer.score(state_with({}), req(), PODS) == {"c": 1.0, "b": 0.5, "a": 0.0}


async def test_hot_requests_are_neutral_and_do_not_touch_the_lru() -> None:
    scorer = make()
    hot = state_with({"b": 3.0})
    assert scorer.score(hot, req(), PODS) == {"a": 0.5, "b": 0.5, "c": 0.5}
    c = ctx(req(), PODS[1])
    c.state.update(hot)
    await scorer.pre_request(c)
    assert scorer.last_used() == []


async def test_missing_prefix_state_counts_as_cold_and_names_are_configurable() -> None:
    scorer = make(prefixPluginType="precise-prefix-cache-scorer", prefixPluginName="p")
    # state of another prefix plugin instance is not looked at
    assert scorer.score(state_with({"a": 1.0}), req(), PODS)["a"] == 1.0
    key = prefix_match_key("precise-prefix-cache-scorer", "p")
    assert scorer.score(state_with({"a": 1.0}, key), req(), PODS) == {"a": 0.5, "b": 0.5, "c": 0.5}


async def test_single_candidate_prefill_and_lru_size() -> None:
    scorer = make(lruSize=2)
    assert scorer.score(state_with({}), req(), PODS[:1]) == {"a": 1.0}
    c = ctx(req(), PODS[0])
    c.prefill = PODS[1]
    c.state.update(state_with({}))
    await scorer.pre_request(c)
    assert scorer.last_used() == ["a", "b"]
    await send_cold(scorer, 2)
    assert scorer.last_used() == ["b", "c"]
    got = scorer.score(state_with({}), req(), PODS)
    assert got == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.0})


def _build(plugins: list[dict[str, object]]) -> dict[str, object]:
    from heimdall_proxy.config.build import build_plugins
    from heimdall_proxy.config.gateway import parse_config
    from heimdall_proxy.datalayer.pool import EndpointPool
    from heimdall_proxy.framework.handle import PluginHandle
    from heimdall_proxy.plugins.builtins import load_builtin_plugins

    cfg = parse_config({"plugins": plugins})
    return build_plugins(cfg.epp, load_builtin_plugins(), PluginHandle(EndpointPool([]))).plugins


def test_a_prefix_plugin_it_cannot_read_fails_the_config_saying_what_to_set() -> None:
    from heimdall_proxy.config.gateway import ConfigError

    # named explicitly, but nothing by that name publishes a match
    with pytest.raises(ConfigError, match="name no declared prefix producer"):
        _build([
            {"type": "no-hit-lru-scorer", "parameters": {"prefixPluginType": "x", "prefixPluginName": "y"}},
            {"type": "queue-scorer"},
        ])  # fmt: skip
    with pytest.raises(
        ConfigError, match="set prefixMatchInfoProducerName: approx-prefix-cache-producer"
    ):
        _build([
            {"type": "no-hit-lru-scorer", "parameters": {"prefixMatchInfoProducerName": "nope"}},
            {"type": "prefix-cache-scorer", "name": "pc"},
        ])  # fmt: skip
    # named by default: it reads the default producer, made for it when none is declared
    alone = _build([{"type": "no-hit-lru-scorer"}, {"type": "queue-scorer"}])
    assert (
        getattr(alone["approx-prefix-cache-producer"], "type", "") == "approx-prefix-cache-producer"
    )
    renamed = _build([{"type": "no-hit-lru-scorer"}, {"type": "prefix-cache-scorer", "name": "pc"}])
    lru = renamed["no-hit-lru-scorer"]
    assert lru.params.prefix_plugin_name == "approx-prefix-cache-producer"  # type: ignore[attr-defined]
    # named correctly, declared after it: fine
    _build([
        {"type": "no-hit-lru-scorer", "parameters": {"prefixPluginName": "pc"}},
        {"type": "prefix-cache-scorer", "name": "pc"},
    ])  # fmt: skip


def test_cold_ranks_are_the_lru_rule_at_any_pool_size() -> None:
    """The numpy ranking equals the rule pod by pod: the candidates the LRU does not hold
    first, in candidate order, then the ones it holds, least recently used first; rank r of
    n scores 1 - r / (n - 1). Over random LRU states and candidate subsets."""
    rng = random.Random(38)
    for trial in range(100):
        pool = [ep(f"p{i}") for i in range(rng.choice([2, 5, 40, 300]))]
        scorer = make(lruSize=rng.choice([3, 50, 1024]))
        for _ in range(rng.randrange(0, 3 * len(pool))):
            scorer._touch(rng.choice(pool).name)
        cands = [e for e in pool if rng.random() < 0.7] or pool[:2]
        if len(cands) < 2:
            cands = pool[:2]
        lru = scorer.last_used()
        never = [e.name for e in cands if e.name not in lru]
        used = sorted((e.name for e in cands if e.name in lru), key=lru.index)
        n = len(cands)
        want = {pod: 1.0 - rank / (n - 1) for rank, pod in enumerate(never + used)}
        got = scorer.score(state_with({}), req(), cands)
        assert dict(got) == want, trial
