"""The scorers' shared state, plugin by plugin, on the real Redis (127.0.0.1:6379)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from pydantic import ValidationError

from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.plugins.prefix_affinity.filter import (
    PrefixCacheAffinityFilter,
    PrefixCacheAffinityParams,
)
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import (
    ApproxPrefixCacheProducer as PrefixCacheScorer,
)
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import (
    ApproxPrefixProducerParams as PrefixCacheParams,
)
from heimdall_proxy.plugins.scheduling.scorers.active_request import (
    ActiveRequestParams,
    ActiveRequestScorer,
)
from heimdall_proxy.plugins.scheduling.scorers.no_hit_lru import NoHitLRUParams, NoHitLRUScorer
from heimdall_proxy.plugins.scheduling.scorers.outstanding_work import (
    OutstandingWorkParams,
    OutstandingWorkScorer,
)
from heimdall_proxy.plugins.scheduling.scorers.prefix_cache import prefix_scores
from heimdall_proxy.replicas.hub import LISTEN_POLL
from heimdall_proxy.replicas.ledger import share_of
from tests.helpers import ep
from tests.kvcache.redisns import REDIS_URL, redis_namespace
from tests.plugins.helpers import ctx, ledger, req, sent, streamed
from tests.plugins.prefix_affinity.test_prefix_affinity import SYSTEM, keyed
from tests.plugins.scheduling.scorers.test_prefix_cache import LONG, completion, route


@pytest.fixture
async def ns() -> AsyncIterator[str]:
    async with redis_namespace() as prefix:
        yield prefix


async def sync(*plugins: object) -> None:
    """One tick of each plugin's gateway ledger's sharing, in order."""
    for plugin in plugins:
        counters = share_of(plugin.load).counters  # type: ignore[attr-defined]
        assert counters is not None
        await counters.sync()


def shared(ns: str, **extra: object) -> dict[str, object]:
    # a long interval: the tests sync by hand, so nothing depends on timing
    return {"redisConfig": {"address": REDIS_URL, "keyPrefix": ns}, "syncInterval": "60s",
            **extra}  # fmt: skip


def test_redis_and_valkey_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="redisConfig or valkeyConfig, not both"):
        PrefixCacheParams.model_validate(
            {"redisConfig": {"address": REDIS_URL}, "valkeyConfig": {"address": REDIS_URL}}
        )


def test_enable_rdma_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    params = PrefixCacheParams.model_validate(
        {"redisConfig": {"address": REDIS_URL, "enableRDMA": True}}
    )
    with caplog.at_level(logging.WARNING):
        PrefixCacheScorer("p", params, None)  # type: ignore[arg-type]
    assert "enableRDMA is accepted but not honoured" in caplog.text


def test_not_shared_by_default() -> None:
    scorer = PrefixCacheScorer("p", PrefixCacheParams(), None)  # type: ignore[arg-type]
    assert scorer.journal is None


@pytest.mark.slow
async def test_the_prefix_index_reaches_a_running_and_a_restarted_replica(ns: str) -> None:
    params = PrefixCacheParams.model_validate(shared(ns, autoTune=False))
    a = PrefixCacheScorer("p", params, None)  # type: ignore[arg-type]
    b = PrefixCacheScorer("p", params, None)  # type: ignore[arg-type]
    await a.start()
    await b.start()
    try:
        pod_x, pod_y = ep("x"), ep("y")
        await route(a, completion(LONG), pod_x)
        assert a.journal is not None and b.journal is not None
        await a.journal.sync()
        await b.journal.sync()
        request = completion(LONG + " and more")
        c = ctx(request, pod_y)  # type: ignore[arg-type]
        await b.produce(c.state, c.request, [pod_x, pod_y])
        info = b.match(c.state, c.request, [pod_x, pod_y])
        scores = prefix_scores(info, [pod_x, pod_y], 0.0, 8192)
        assert scores["x"] > 0.9 and scores["y"] == 0.0
    finally:
        await a.stop()
        await b.stop()
    # a replica started afterwards reads the history
    late = PrefixCacheScorer("p", params, None)  # type: ignore[arg-type]
    await late.start()
    try:
        assert late.index.size("x") == a.index.size("x") > 0
    finally:
        await late.stop()


@pytest.mark.slow
async def test_the_no_hit_lru_is_shared(ns: str) -> None:
    params = NoHitLRUParams.model_validate(shared(ns))
    a = NoHitLRUScorer("lru", params, None)  # type: ignore[arg-type]
    b = NoHitLRUScorer("lru", params, None)  # type: ignore[arg-type]
    await a.start()
    await b.start()
    try:
        for pod in ("p1", "p0"):
            await a.pre_request(ctx(req(), ep(pod)))  # cold: no prefix plugin ran
        assert a.journal is not None and b.journal is not None
        await a.journal.sync()
        await b.journal.sync()
        assert b.last_used() == ["p1", "p0"]
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.slow
async def test_outstanding_work_sums_the_replicas(ns: str) -> None:
    params = OutstandingWorkParams.model_validate(shared(ns))
    a = OutstandingWorkScorer("w", params, ledger())
    b = OutstandingWorkScorer("w", params, ledger())
    await a.start()
    await b.start()
    try:
        await a.pre_request(ctx(req(data={"max_tokens": 100}), ep("p0")))
        await sync(a, b)
        assert b.work("p0") == a.work("p0") >= 100
        scores = b.score(None, req(), [ep("p0"), ep("p1")])  # type: ignore[arg-type]
        assert scores == {"p0": 0.0, "p1": 1.0}
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.slow
async def test_the_affinity_filter_counts_the_other_replicas_prompt_tokens(ns: str) -> None:
    params = PrefixCacheAffinityParams.model_validate(shared(ns))
    a = PrefixCacheAffinityFilter("f", params, ledger())
    b = PrefixCacheAffinityFilter("f", params, ledger())
    await a.start()
    await b.start()
    try:
        before = b.estimated_ttft("p0", None, 100)
        await a.pre_request(sent(a.load, ctx(completion("word " * 4000), ep("p0"))))
        await sync(a, b)
        # 20000 characters: 5000 prompt tokens in flight through a, at 16000 tokens/s
        assert b.estimated_ttft("p0", None, 100) - before == pytest.approx(5000 / 16000)
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.slow
async def test_the_affinity_filter_learns_the_queue_price_from_every_replica(ns: str) -> None:
    params = PrefixCacheAffinityParams.model_validate(shared(ns))
    a = PrefixCacheAffinityFilter("f", params, ledger())
    b = PrefixCacheAffinityFilter("f", params, ledger())
    await a.start()
    await b.start()
    late = PrefixCacheAffinityFilter("f", params, ledger())
    default = 1.0 / 16000
    try:
        # one request stays in flight on p0, so each streamed one after it has tokens ahead
        await a.pre_request(sent(a.load, ctx(completion("word " * 4000), ep("p0"))))
        for _ in range(4):  # QueueDelay's minimum before a pod's own price is used
            c = ctx(completion("word " * 400, stream=True), ep("p0"))
            await a.pre_request(sent(a.load, c))
            a.load.prompt_done(c.key)  # the relay, at the first chunk: the ledger learns
            await streamed(a, c, b'data: {"choices": []}\n\n')
            await a.response_complete(c)
            a.load.release(c.key)
        assert a.queue_price is not None and b.queue_price is not None
        assert a.queue_price is a.load.queue_price(default)  # the ledger's
        learned = a.queue_price.price("p0")
        assert learned != default
        assert b.queue_price.price("p0") == default
        assert a.journal is not None and b.journal is not None
        await a.journal.sync()
        await b.journal.sync()
        assert b.queue_price.price("p0") == pytest.approx(learned)
        # a replica started later reads the samples still kept
        await late.start()
        assert late.queue_price is not None
        assert late.queue_price.price("p0") == pytest.approx(learned)
    finally:
        await late.stop()
        await a.stop()
        await b.stop()


@pytest.mark.slow
async def test_a_price_sample_counts_the_other_replicas_prompts_ahead(ns: str) -> None:
    """What was ahead of an attempt on a pod is every replica's prompt tokens in flight there,
    as the filter's estimate multiplies the price by."""
    params = PrefixCacheAffinityParams.model_validate(shared(ns))
    a = PrefixCacheAffinityFilter("f", params, ledger())
    b = PrefixCacheAffinityFilter("f", params, ledger())
    await a.start()
    await b.start()
    try:
        await a.pre_request(sent(a.load, ctx(completion("word " * 4000), ep("p0"))))
        mine, theirs = share_of(a.load).counters, share_of(b.load).counters
        assert mine is not None and theirs is not None  # each filter's store shares the ledger
        await mine.sync()
        await theirs.sync()
        c = ctx(completion("word " * 400, stream=True), ep("p0"))
        await b.pre_request(sent(b.load, c))
        assert b.queue_price is not None
        _, ahead, requests, *_ = b.queue_price._waiting[c.key]
        assert ahead == 5000.0  # a's 20000 characters, none of b's own
        assert requests == 1  # and a's request: the free depth counts every replica's
    finally:
        await a.stop()
        await b.stop()
    assert b.queue_price.journal is None and b.queue_price.elsewhere is None  # left with b


def test_the_affinity_filter_shares_no_samples_when_it_learns_none(ns: str) -> None:
    params = PrefixCacheAffinityParams.model_validate(shared(ns, learnQueueDelay=False))
    f = PrefixCacheAffinityFilter("f", params, ledger())
    assert f.ledger_store is not None and f.journal is None


def ledger_handle(load: InFlightLoad) -> PluginHandle:
    return PluginHandle(EndpointPool([]), load=load)


@pytest.mark.slow
async def test_a_reloaded_replica_counts_its_requests_once_on_every_side(ns: str) -> None:
    # old and new: one gateway's plugin before and after a config reload; other: a replica
    params = ActiveRequestParams.model_validate(shared(ns))
    mine, theirs = InFlightLoad(), InFlightLoad()  # each gateway's one ledger
    old, new = (ActiveRequestScorer("a", params, ledger_handle(mine)) for _ in range(2))
    other = ActiveRequestScorer("a", params, ledger_handle(theirs))
    for scorer in (old, new, other):
        await scorer.start()
    try:
        for i in range(3):
            c = ctx(req(), ep("p0"), attempt=i)
            mine.acquire(c.key, "p0")  # as the relay does
        await sync(old)
        await old.stop()  # the reload's old plugin leaves: the new one holds the sharing
        await sync(new, other, new, other)  # everyone has read everyone
        assert new.count("p0") == other.count("p0") == 3
        assert share_of(mine).counters is not None  # still shared, as the same replica
    finally:
        for scorer in (new, other):
            await scorer.stop()


@pytest.mark.slow
async def test_the_replica_poke_and_the_send_listeners_both_hear_a_send(ns: str) -> None:
    """The data layer listens to the ledger's sends (`on_send`) beside the replica sharing's
    poke: a's acquire still pokes its hub into pushing (60 s interval, no hand sync), and
    b's listeners hear of the pod once b counts a's request."""
    params = ActiveRequestParams.model_validate(shared(ns))
    mine, theirs = InFlightLoad(), InFlightLoad()
    a = ActiveRequestScorer("a", params, ledger_handle(mine))
    b = ActiveRequestScorer("a", params, ledger_handle(theirs))
    heard: dict[str, list[tuple[str, int]]] = {"mine": [], "theirs": []}
    for side, load in (("mine", mine), ("theirs", theirs)):
        for _ in range(2):
            load.on_send(lambda pod, h=heard[side], load=load: h.append((pod, load.requests[pod])))
    await a.start()
    await b.start()
    try:
        await asyncio.sleep(LISTEN_POLL * 2)  # the hub's listener has subscribed
        assert mine.poke is not None  # the sharing holds its slot
        mine.acquire("r:0", "p0")
        assert heard["mine"] == [("p0", 1), ("p0", 1)]
        async with asyncio.timeout(10.0):
            while b.count("p0") != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert heard["theirs"] == [("p0", 1), ("p0", 1)]
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.slow
async def test_the_affinity_filters_popularity_counts_every_replicas_requests(ns: str) -> None:
    """The filters' hub ticks only when poked (60 s interval): a's requests reach b's count
    in the pushes a's counters send anyway."""
    params = PrefixCacheAffinityParams.model_validate(shared(ns, sharedPrefixDiscount=0.75))
    a = PrefixCacheAffinityFilter("f", params, ledger())
    b = PrefixCacheAffinityFilter("f", params, ledger())
    await a.start()
    await b.start()
    try:
        await asyncio.sleep(LISTEN_POLL * 2)  # the hub's listener has subscribed
        for i in range(10):
            c = ctx(completion(f"turn {i}"), ep("p1"), attempt=i)
            c.state = keyed({"p1": 100.0}, SYSTEM)
            a.filter(c.state, c.request, [ep("p0"), ep("p1")])  # leaves the prefix to count
            await a.pre_request(sent(a.load, c))
        assert a.popularity.count(SYSTEM[-1]) > 9
        async with asyncio.timeout(10.0):
            while b.popularity.count(SYSTEM[-1]) != a.popularity.count(SYSTEM[-1]):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        await a.stop()
        await b.stop()


def test_the_popularity_rides_on_no_push_without_the_discount(ns: str) -> None:
    f = PrefixCacheAffinityFilter(
        "f", PrefixCacheAffinityParams.model_validate(shared(ns)), ledger()
    )
    assert f.ledger_store is not None and f.ledger_rider is None


@pytest.mark.slow
async def test_another_replicas_pushed_requests_are_counted_once_across_a_reload(
    ns: str,
) -> None:
    # old and new: one gateway's filter before and after a reload, both running while the
    # old requests drain; their gateway's one ledger takes every replica's push once
    params = PrefixCacheAffinityParams.model_validate(shared(ns, sharedPrefixDiscount=0.75))
    mine, theirs = InFlightLoad(), InFlightLoad()
    gateway = ledger_handle(mine)  # old and new read one gateway's ledger and popularity
    old, new = (PrefixCacheAffinityFilter("f", params, gateway) for _ in range(2))
    other = PrefixCacheAffinityFilter("f", params, ledger_handle(theirs))
    assert new.popularity is old.popularity
    for filt in (old, new, other):
        await filt.start()
    try:
        assert new.inherit(old, frozenset()) is None
        their_counters, my_counters = share_of(theirs).counters, share_of(mine).counters
        assert their_counters is not None and my_counters is not None
        other.popularity.observe(42)
        their_counters.script_args()
        assert my_counters.pushed(their_counters.push_message())
        assert new.popularity.count(42) == pytest.approx(1.0)  # not 1 + 1 decayed by a step
    finally:
        for filt in (old, new, other):
            await filt.stop()
