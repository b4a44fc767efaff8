"""What a reload keeps (framework.inherit): plugins built from the new config take over the
learned state of the same-named plugins of the old one, share it with them while the old
requests finish, and start empty (saying why) when the state's meaning changed."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest

from heimdall_proxy.config.build import PluginSet, build_plugins
from heimdall_proxy.config.gateway import parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.inherit import inherit_state
from heimdall_proxy.framework.popularity import Popularities
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.predicted_latency.producer import PredictedLatencyProducer
from heimdall_proxy.plugins.prefix_affinity.filter import PrefixCacheAffinityFilter
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import ApproxPrefixCacheProducer
from heimdall_proxy.plugins.scheduling.scorers.active_request import ActiveRequestScorer
from heimdall_proxy.plugins.scheduling.scorers.no_hit_lru import NoHitLRUScorer
from heimdall_proxy.plugins.scheduling.scorers.outstanding_work import OutstandingWorkScorer
from heimdall_proxy.plugins.store.responses_store import ResponsesStore
from tests.helpers import ep
from tests.plugins.helpers import ctx, req, sent

PODS = [ep("pod-a"), ep("pod-b")]
NONE: frozenset[str] = frozenset()
PROMPT = "You are a careful assistant who answers in full sentences. " * 8


#: Every plugin type that keeps state worth a reload (each declared once, named after it).
STATEFUL = [
    "prefix-cache-scorer",
    "prefix-cache-affinity-filter",
    "no-hit-lru-scorer",
    "outstanding-work-scorer",
    "predicted-latency-producer",
    "responses-store",
]


def doc(**overrides: dict[str, Any]) -> dict[str, Any]:
    """Every plugin that keeps state, and a picker, with `overrides` as parameters by type."""
    # active-request-scorer keeps nothing: its counts are the gateway's ledger's
    types = [*STATEFUL, "active-request-scorer", "max-score-picker"]
    return {
        "featureGates": ["prepareDataPlugins"],
        "plugins": [{"type": t, "parameters": overrides.get(t, {})} for t in types],
        "endpoints": [{"name": p.name, "url": p.url} for p in PODS],
    }


#: The gateway's in-flight ledger and prefix popularity, which outlive a reload: every plugin
#: set built here shares them, as the routings of one gateway do.
LEDGER = InFlightLoad()
POPULARITY = Popularities()


@pytest.fixture(autouse=True)
def empty_ledger() -> None:
    LEDGER.forget(set(LEDGER.requests))


def build(d: dict[str, Any]) -> PluginSet:
    cfg = parse_config(d, "test.yaml")
    handle = PluginHandle(
        EndpointPool(cfg.endpoints),
        frozenset(cfg.epp.feature_gates),
        load=LEDGER,
        popularity=POPULARITY,
    )
    return build_plugins(cfg.epp, load_builtin_plugins(), handle)


def get(pset: PluginSet, cls: type[Any]) -> Any:
    (found,) = [p for p in pset.plugins.values() if isinstance(p, cls)]
    return found


async def serve_one(pset: PluginSet, target: int = 0) -> Any:
    """Schedule-side state of one request sent to PODS[target] (its pre_request hooks run);
    the context, to complete it later."""
    c = ctx(req(data={"messages": [{"role": "user", "content": PROMPT}]}), PODS[target])
    c.state = CycleState()
    get(pset, ApproxPrefixCacheProducer).match(c.state, c.request, PODS)
    get(pset, NoHitLRUScorer).score(c.state, c.request, PODS)
    affinity = get(pset, PrefixCacheAffinityFilter)
    affinity.filter(c.state, c.request, PODS)
    sent(LEDGER, c)  # as the relay does, once per attempt
    for cls in (ApproxPrefixCacheProducer, NoHitLRUScorer, OutstandingWorkScorer):
        await get(pset, cls).pre_request(c)
    await affinity.pre_request(c)
    return c


@pytest.mark.slow
async def test_a_reload_keeps_every_plugins_state_and_shares_it_with_the_old_requests() -> None:
    old = build(doc())
    running = await serve_one(old)
    await get(old, ResponsesStore).backend.put("resp_1", b'{"owner": ""}')

    new = build(doc())
    kept = inherit_state(old.plugins, new.plugins, NONE)

    # the index is the producer's the loader made for prefix-cache-scorer
    assert sorted(kept) == sorted([*STATEFUL[1:], "approx-prefix-cache-producer"])
    # the prompt still matches where it was sent, the LRU remembers the cold request ...
    probe = ctx(req(data={"messages": [{"role": "user", "content": PROMPT}]}), PODS[1])
    info = get(new, ApproxPrefixCacheProducer).match(probe.state, probe.request, PODS)
    assert set(info.matched_blocks) == {"pod-a"}
    assert get(new, NoHitLRUScorer).last_used() == ["pod-a"]
    # ... the request still running counts against its pod ...
    assert get(new, ActiveRequestScorer).count("pod-a") == 1
    assert get(new, PrefixCacheAffinityFilter).estimated_ttft("pod-a", None, 0) > 0
    assert get(new, OutstandingWorkScorer).work("pod-a") > 0
    # ... and the stored response can still be continued
    assert await get(new, ResponsesStore).backend.get("resp_1") == b'{"owner": ""}'
    assert (
        get(new, PredictedLatencyProducer).predictor is get(old, PredictedLatencyProducer).predictor
    )

    # to other replicas the ledger is published once, whichever plugins read it
    published = LEDGER.published()
    assert {key.split("\x1f")[1] for key in published} == {"pod-a"}
    assert published["r\x1fpod-a"] == 1.0

    # the old request ends on the old plugins (and leaves the gateway's ledger, as the relay
    # reports): the new ones see it gone
    LEDGER.release(running.key)
    await get(old, OutstandingWorkScorer).response_complete(running)
    assert get(new, ActiveRequestScorer).count("pod-a") == 0
    assert get(new, OutstandingWorkScorer).work("pod-a") == 0


@pytest.mark.slow
async def test_a_state_whose_meaning_changed_starts_empty_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = build(doc())
    await serve_one(old)
    new = build(
        doc(
            **{
                "prefix-cache-scorer": {"blockSizeTokens": 32},
                "predicted-latency-producer": {"streamingMode": True},
            }
        )
    )
    with caplog.at_level(logging.INFO, logger="heimdall_proxy.framework.inherit"):
        kept = inherit_state(old.plugins, new.plugins, NONE)

    assert "approx-prefix-cache-producer" not in kept and "predicted-latency-producer" not in kept
    assert "blockSizeTokens changed" in caplog.text
    assert "the model starts untrained: streamingMode changed" in caplog.text
    probe = ctx(req(data={"messages": [{"role": "user", "content": PROMPT}]}), PODS[1])
    assert (
        not get(new, ApproxPrefixCacheProducer)
        .match(probe.state, probe.request, PODS)
        .matched_blocks
    )
    old_lat, new_lat = get(old, PredictedLatencyProducer), get(new, PredictedLatencyProducer)
    assert new_lat.predictor is not old_lat.predictor
    assert new_lat.load is old_lat.load  # the gateway's ledger is kept all the same
    # a new lruCapacityPerServer is not a new meaning: the index is kept, with the new bound
    newer = build(
        doc(**{"prefix-cache-scorer": {"blockSizeTokens": 32, "lruCapacityPerServer": 7}})
    )
    assert "approx-prefix-cache-producer" in inherit_state(new.plugins, newer.plugins, NONE)


def test_a_name_taken_by_another_type_inherits_nothing() -> None:
    old = build(doc())
    d = doc()
    d["plugins"][STATEFUL.index("outstanding-work-scorer")] = {
        "type": "queue-scorer",
        "name": "outstanding-work-scorer",
    }
    assert "outstanding-work-scorer" not in inherit_state(old.plugins, build(d).plugins, NONE)


async def test_the_store_keeps_its_entries_under_the_new_limits() -> None:
    old = build(doc())
    backend = get(old, ResponsesStore).backend
    for i in range(3):
        await backend.put(f"resp_{i}", b"x")
    new = build(doc(**{"responses-store": {"storeConfig": {"inMemoryConfig": {"maxEntries": 2}}}}))
    assert "responses-store" in inherit_state(old.plugins, new.plugins, NONE)
    store = get(new, ResponsesStore)
    await store.backend.put("resp_3", b"x")
    assert len(store.backend) == 2  # the new bound, applied at the next put
    assert await store.backend.get("resp_3") == b"x"


def test_a_tiered_store_is_not_carried_over(caplog: pytest.LogCaptureFixture) -> None:
    old = build(doc())
    tiered = {"storeConfig": {"tieredConfig": {"redis": {"address": "redis://127.0.0.1:6379"}}}}
    new = build(doc(**{"responses-store": tiered}))
    with caplog.at_level(logging.INFO, logger="heimdall_proxy.framework.inherit"):
        assert "responses-store" not in inherit_state(old.plugins, new.plugins, NONE)
    assert "entries not carried over: only an in-memory store's are" in caplog.text


def test_a_plugin_whose_inherit_raises_is_logged_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a deliberately broken plugin: its inherit is replaced by one that raises
    old, new = build(doc()), build(doc())

    def broken(previous: Any) -> str | None:
        raise RuntimeError("boom")

    monkeypatch.setattr(get(new, NoHitLRUScorer), "inherit", broken)
    kept = inherit_state(old.plugins, new.plugins, NONE)
    assert "no-hit-lru-scorer" not in kept and "approx-prefix-cache-producer" in kept
    assert "could not take over its predecessor's state" in caplog.text


async def test_the_state_of_pods_gone_or_replaced_is_dropped() -> None:
    old = build(doc())
    await serve_one(old, target=0)
    await serve_one(old, target=1)
    new = build(doc())
    inherit_state(old.plugins, new.plugins, frozenset({"pod-a"}))
    probe = ctx(req(data={"messages": [{"role": "user", "content": PROMPT}]}), PODS[1])
    info = get(new, ApproxPrefixCacheProducer).match(probe.state, probe.request, PODS)
    assert set(info.matched_blocks) == {"pod-b"}  # pod-a's cache is another server's now
    assert get(new, NoHitLRUScorer).last_used() == []  # pod-a took the one cold request
    # its requests still in flight count until they end
    assert get(new, ActiveRequestScorer).count("pod-a") == 1


def test_records_of_other_replicas_are_applied_once_by_the_successor() -> None:
    old = build(doc())
    new = build(doc())
    inherit_state(old.plugins, new.plugins, NONE)
    # both journals read the stream while the old requests drain: only the new one applies
    get(old, NoHitLRUScorer)._apply(["pod-a"])
    assert get(new, NoHitLRUScorer).last_used() == []
    get(new, NoHitLRUScorer)._apply(["pod-b"])
    assert get(new, NoHitLRUScorer).last_used() == ["pod-b"]


def test_a_reload_can_import_what_building_its_plugins_will_import_beforehand() -> None:
    # what the reload runs in a thread before building the new plugins on the event loop
    registry = load_builtin_plugins()
    spec = registry.get("request-attribute-reporter")
    assert spec is not None and spec.imports == ("cel_expr_python.cel",)

    @register("lazy-test-plugin", imports=("colorsys",))
    class Lazy:
        pass

    registry.add(Lazy)
    sys.modules.pop("colorsys", None)
    registry.preload(["queue-scorer", "lazy-test-plugin", "no-such-type"])
    assert "colorsys" in sys.modules
