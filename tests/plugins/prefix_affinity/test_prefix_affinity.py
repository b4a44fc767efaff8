"""prefix-cache-affinity-filter: sticky while it pays, released when the warm pods are busy."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from heimdall_proxy.config.build import build_plugins
from heimdall_proxy.config.gateway import parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.prefix_affinity.filter import (
    PrefixCacheAffinityFilter,
    PrefixCacheAffinityParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ctx, ledger, req, sent

PODS = [ep("a"), ep("b"), ep("c")]
KEY = "approx-prefix-cache-producer/approx-prefix-cache-producer"


def make(**params: Any) -> PrefixCacheAffinityFilter:
    p = PrefixCacheAffinityParams.model_validate({"maxTTFTPenaltyMs": 0, **params})
    return PrefixCacheAffinityFilter("f", p, ledger())


def state(matched: dict[str, float], prompt_tokens: int = 1600) -> CycleState:
    s = CycleState()
    s[KEY] = PrefixCacheMatchInfo(16, prompt_tokens // 16, prompt_tokens, matched)
    return s


def names(endpoints: list[Any]) -> list[str]:
    return [e.name for e in endpoints]


async def occupy(f: PrefixCacheAffinityFilter, pod: int, n: int, tokens: int = 1600) -> None:
    for i in range(n):
        c = ctx(req(data={"i": i}), PODS[pod], attempt=i)
        c.state.update(state({}, tokens))
        await f.pre_request(sent(f.load, c))


def test_defaults_follow_the_reference() -> None:
    p = PrefixCacheAffinityParams()
    assert p.affinity_threshold == 0.80
    assert (p.prefix_plugin_type, p.prefix_plugin_name) == ("prefix-cache-scorer",) * 2
    assert p.exploration_probability == 0.0
    assert (p.max_ttft_penalty_ms, p.peak_prefill_throughput) == (200.0, 16000.0)


def test_keeps_the_pods_holding_the_prefix() -> None:
    f = make()
    assert names(f.filter(state({"a": 100.0, "b": 50.0}), req(), PODS)) == ["a"]


def test_cold_requests_and_all_warm_fleets_are_not_narrowed() -> None:
    f = make()
    assert names(f.filter(state({}), req(), PODS)) == ["a", "b", "c"]
    assert names(f.filter(state({"a": 79.0}), req(), PODS)) == ["a", "b", "c"]  # below 0.8
    full = {"a": 100.0, "b": 100.0, "c": 100.0}
    assert names(f.filter(state(full), req(), PODS)) == ["a", "b", "c"]
    assert names(f.filter(CycleState(), req(), PODS)) == ["a", "b", "c"]  # no prefix plugin


async def test_released_when_the_warm_pod_would_answer_later_than_a_cold_one() -> None:
    f = make()
    s = state({"a": 100.0})
    await occupy(f, 0, 1)  # a: one prompt in flight; b, c idle
    # a: (1600 in flight + 0 to compute); b: (0 + 1600): equal, so stay warm
    assert names(f.filter(s, req(), PODS)) == ["a"]
    await occupy(f, 0, 1)  # a: 3200 vs 1600 on an idle cold pod: release
    assert names(f.filter(s, req(), PODS)) == ["a", "b", "c"]


async def test_a_penalty_keeps_the_affinity_longer() -> None:
    f = make(maxTTFTPenaltyMs=500, peakPrefillThroughput=16000)  # 500 ms = 8000 tokens
    await occupy(f, 0, 5)  # a: 8000 in flight vs 1600 on a cold pod: 6400 tokens later
    assert names(f.filter(state({"a": 100.0}), req(), PODS)) == ["a"]
    await occupy(f, 0, 2)  # 11200 vs 1600: 9600 tokens (600 ms) later
    assert names(f.filter(state({"a": 100.0}), req(), PODS)) == ["a", "b", "c"]


async def test_a_penalty_ratio_holds_the_affinity_when_every_pod_is_deep() -> None:
    # 0 ms + 50% of the best other pod's estimate: a difference that releases a shallow pod
    # keeps a deep one, where it is within the noise of what is queued.
    f = make(maxTTFTPenaltyRatio=0.5)
    s = state({"a": 100.0})
    await occupy(f, 0, 2)  # a: 3200 vs b, c: 1600 (idle, prompt to compute): release
    assert names(f.filter(s, req(), PODS)) == ["a", "b", "c"]
    for pod in (1, 2):
        await occupy(f, pod, 8)  # b, c: 12800 + 1600 = 14400
    await occupy(f, 0, 8)  # a: 16000, 1600 more than b: within 50% of 14400, stay
    assert names(f.filter(s, req(), PODS)) == ["a"]
    await occupy(f, 0, 14)  # a: 38400 > 14400 * 1.5: release
    assert names(f.filter(s, req(), PODS)) == ["a", "b", "c"]


async def test_the_prompts_in_flight_are_the_ledgers() -> None:
    """The filter counts nothing itself: what the relay dispatched and has not seen end."""
    f = make()
    c = ctx(req(), PODS[0])
    c.state.update(state({}))
    other = ctx(req(), PODS[0], attempt=1)
    for x in (c, other):
        await f.pre_request(sent(f.load, x))
    assert f.estimated_ttft("a", None, 0) == pytest.approx(1600 / 16000)  # c's 1600 tokens
    for x in (c, other):
        await f.response_complete(x)
        f.load.release(x.key)
    assert f.estimated_ttft("a", None, 0) == 0.0


def test_exploration_sometimes_skips_the_narrowing() -> None:
    f = make(explorationProbability=1.0)
    assert names(f.filter(state({"a": 100.0}), req(), PODS)) == ["a", "b", "c"]


CONFIG = """
plugins:
- type: prefix-cache-scorer
- type: prefix-cache-affinity-filter
  parameters: {maxTTFTPenaltyMs: 200}
- type: outstanding-work-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: prefix-cache-scorer
  - pluginRef: outstanding-work-scorer
    weight: 2
  - pluginRef: max-score-picker
"""


async def test_a_hot_prefix_spreads_over_pods_as_load_grows() -> None:
    """With the real scheduler: one long shared prompt sent again and again stays on the pod
    that holds it while it is light, and moves on to the next pod once it is busy."""
    pool = EndpointPool(parse_config({"endpoints": [
        {"name": n, "url": f"http://{n}:80"} for n in ("a", "b", "c")
    ]}).endpoints)  # fmt: skip
    cfg = parse_config(yaml.safe_load(CONFIG))
    handle = PluginHandle(pool=pool)
    pset = build_plugins(cfg.epp, load_builtin_plugins(), handle)
    prompt = "shared system prompt " * 400
    picks = []
    for i in range(6):
        r = req(data={"messages": [{"role": "user", "content": prompt + str(i)}]})
        r.request_id = f"r{i}"
        st = CycleState()
        for p in pset.producers:
            await p.produce(st, r, pool.endpoints())
        result = pset.scheduler.schedule(st, r, pool.endpoints())
        target = result.primary.targets[0]
        picks.append(target.name)
        c = ctx(r, target)
        c.state = st
        sent(handle.load, c)
        for hook in pset.pre_request:
            await hook.pre_request(c)
    assert picks[0] == picks[1]  # the second copy follows the first
    assert len(set(picks)) > 1  # and the prefix did not pile onto one pod


TWO_INSTANCES = """
plugins:
- type: prefix-cache-scorer
- type: prefix-cache-affinity-filter
  name: strict-affinity
  parameters: {affinityThreshold: 0.99, maxTTFTPenaltyMs: 1000}
- type: prefix-cache-affinity-filter
  name: loose-affinity
  parameters: {affinityThreshold: 0.8, maxTTFTPenaltyMs: 1000}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: loose-affinity}, {pluginRef: strict-affinity},
            {pluginRef: prefix-cache-scorer}]
"""


def test_several_named_instances_keep_their_own_threshold() -> None:
    """As in llm-d's predicted-latency config: a strict (0.99) and a loose (0.8) instance."""
    pool = EndpointPool(parse_config({"endpoints": [
        {"name": n, "url": f"http://{n}:80"} for n in ("a", "b", "c")
    ]}).endpoints)  # fmt: skip
    cfg = parse_config(yaml.safe_load(TWO_INSTANCES))
    pset = build_plugins(cfg.epp, load_builtin_plugins(), PluginHandle(pool=pool))
    strict, loose = pset.plugins["strict-affinity"], pset.plugins["loose-affinity"]
    assert isinstance(strict, PrefixCacheAffinityFilter)
    assert isinstance(loose, PrefixCacheAffinityFilter)
    match = state({"a": 100.0, "b": 90.0})  # a holds all 100 blocks, b 90 of them
    assert names(strict.filter(match, req(), PODS)) == ["a"]
    assert names(loose.filter(match, req(), PODS)) == ["a", "b"]
    assert pset.resolved_profiles[0].filters == ["loose-affinity", "strict-affinity"]


def keyed(matched: dict[str, float], keys: list[int], prompt_tokens: int = 1600) -> CycleState:
    """A match whose prompt's chained block keys are `keys` (one per 16-token block)."""
    s = CycleState()
    s[KEY] = PrefixCacheMatchInfo(16, len(keys), prompt_tokens, matched, block_keys=keys)
    return s


SYSTEM = list(range(1000, 1100))  # one shared 100-block prefix
OWN = [list(range(5000 + 100 * i, 5100 + 100 * i)) for i in range(40)]  # 40 distinct ones
SENT = iter(range(10**6))


async def send(f: PrefixCacheAffinityFilter, s: CycleState, pod: int) -> list[str]:
    """Filter a request, then send it to PODS[pod] (pre_request; it stays in flight)."""
    kept = names(f.filter(s, req(), PODS))
    c = ctx(req(data={"sent": next(SENT)}), PODS[pod], attempt=next(SENT))
    c.state = s
    await f.pre_request(c)
    return kept


async def test_a_prefix_many_requests_share_is_released_at_a_smaller_margin() -> None:
    # 500 ms = 8000 tokens. While b and c take 20 requests each of a shared prefix (own:
    # 20 distinct ones), a is 6400 tokens (400 ms) later than a cold pod. A prefix only this
    # request has keeps the whole margin and stays; one that ~20 recent requests shared is
    # released at 500 / 20 ** 0.75 = 53 ms.
    shared = make(maxTTFTPenaltyMs=500, sharedPrefixDiscount=0.75)
    own = make(maxTTFTPenaltyMs=500, sharedPrefixDiscount=0.75)
    for f in (shared, own):
        await occupy(f, 0, 5)
    for i in range(20):
        await send(shared, keyed({"b": 100.0, "c": 100.0}, SYSTEM), 1 + i % 2)
        await send(own, keyed({"b": 100.0, "c": 100.0}, OWN[i]), 1 + i % 2)
    assert shared.popularity.count(SYSTEM[-1]) > 15
    # b and c now hold 16000 tokens each; d is idle and cold: a (8000 tokens) is 400 ms
    # later than d
    wide = [*PODS, ep("d")]
    assert names(shared.filter(keyed({"a": 100.0}, SYSTEM), req(), wide)) == names(wide)
    assert names(own.filter(keyed({"a": 100.0}, OWN[30]), req(), wide)) == ["a"]


async def test_without_the_discount_every_prefix_keeps_the_margin() -> None:
    f = make(maxTTFTPenaltyMs=500)  # sharedPrefixDiscount: 0, the default
    await occupy(f, 0, 5)
    for i in range(20):
        await send(f, keyed({"b": 100.0, "c": 100.0}, SYSTEM), 1 + i % 2)
    wide = [*PODS, ep("d")]
    assert names(f.filter(keyed({"a": 100.0}, SYSTEM), req(), wide)) == ["a"]
    assert len(f.popularity) == 0


async def test_the_prefix_counted_is_the_longest_a_sticky_pod_holds() -> None:
    f = make(sharedPrefixDiscount=1.0)
    # a holds the whole prompt, b its first 90 blocks: moving would give up all 100 blocks
    await send(f, keyed({"a": 100.0, "b": 90.0}, SYSTEM), 0)
    assert f.popularity.count(SYSTEM[99]) == 1.0
    assert f.popularity.count(SYSTEM[89]) == 0.0
    await send(f, keyed({}, OWN[0]), 1)  # cold: counted for no prefix
    assert len(f.popularity) == 1


async def test_filtering_alone_counts_nothing() -> None:
    """Retried scheduling and the debug route filter without sending: only a request that
    is sent counts."""
    f = make(sharedPrefixDiscount=1.0)
    for _ in range(5):
        f.filter(keyed({"a": 100.0}, SYSTEM), req(), PODS)
    assert len(f.popularity) == 0


async def test_with_the_shipped_config_a_shared_prefix_is_counted_when_sent() -> None:
    """The whole pipeline of config/recommended.yaml (producers, filters, scorers, pre_request
    hooks): the filter's own CycleState entry must not take the prefix plugin's place, as it
    once did, after which every plugin reading the match saw none and nothing was counted."""
    from heimdall_proxy.cli.args import embedded_config_text  # the shipped recommended.yaml

    doc = yaml.safe_load(embedded_config_text())
    doc["endpoints"] = [{"name": n, "url": f"http://{n}:80"} for n in ("a", "b", "c")]
    cfg = parse_config(doc)
    pool = EndpointPool(cfg.endpoints)
    pset = build_plugins(cfg.epp, load_builtin_plugins(), PluginHandle(pool=pool))
    (f,) = [p for p in pset.plugins.values() if isinstance(p, PrefixCacheAffinityFilter)]
    system = "You are the support assistant of a large shop. " * 60
    for i in range(4):
        r = req(data={"messages": [{"role": "system", "content": system},
                                   {"role": "user", "content": f"question {i}"}]})  # fmt: skip
        r.request_id = f"r{i}"
        st = CycleState()
        for p in pset.producers:
            await p.produce(st, r, pool.endpoints())
        target = pset.scheduler.schedule(st, r, pool.endpoints()).primary.targets[0]
        assert isinstance(st.get(KEY), PrefixCacheMatchInfo)
        c = ctx(r, target)
        c.state = st
        for hook in pset.pre_request:
            await hook.pre_request(c)
    assert len(f.popularity) == 1  # the system prompt, counted from the second request on
