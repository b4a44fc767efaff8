"""Following KV-event publishers over real ZMQ sockets: order, gaps and replay, restarts,
a bound socket named by topic, pods joining and leaving, a failing subscription's backoff."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import resource
import time
from typing import Any

import pytest
import zmq
import zmq.asyncio

from heimdall_proxy.cli.args import raise_open_files_limit
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.kvcache.events import AllBlocksCleared, BlockStored, EventBatch
from heimdall_proxy.kvcache.hashing import local_hashes, namespace_seed
from heimdall_proxy.kvcache.prepare import EventPreparer
from heimdall_proxy.kvcache.subscriber import (
    APPLY_SLICE,
    KVEventsSubscriber,
    SubscriberOptions,
    replay_endpoint,
)
from tests.conftest import eventually
from tests.kvcache.vllm_wire import Publisher, batch, cleared, stored, until_live


class Pool:
    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.list = endpoints

    def endpoints(self) -> list[Endpoint]:
        return self.list

    def get(self, name: str) -> Endpoint | None:
        return next((e for e in self.list if e.name == name), None)


def pod(name: str, kv: str | None = None, host: str = "127.0.0.1") -> Endpoint:
    return Endpoint(name=name, url=f"http://{host}:8000", host=host, port=8000, kv_events=kv)


class Sink:
    def __init__(self) -> None:
        self.batches: list[tuple[str, EventBatch]] = []
        self.forgotten: list[str] = []

    async def apply(self, pod: str, b: EventBatch) -> None:
        self.batches.append((pod, b))

    async def forget(self, pod: str) -> None:
        self.forgotten.append(pod)

    def tokens(self) -> list[int]:
        """First token of every stored event, in order applied."""
        return [
            e.token_ids[0] for _, b in self.batches for e in b.events if isinstance(e, BlockStored)
        ]


async def follow(pool: Pool, sink: Sink, **opts: Any) -> KVEventsSubscriber:
    sub = KVEventsSubscriber(SubscriberOptions(**opts), pool, sink.apply, sink.forget)
    await sub.start()
    return sub


def ev(n: int) -> bytes:
    return batch([stored([n], [n] * 16)])


@pytest.mark.parametrize("shape", ["map", "array", "map-batch"])
async def test_batches_arrive_in_order(ctx: zmq.asyncio.Context, shape: str) -> None:
    pub = Publisher(ctx, replay=False)
    sink = Sink()
    sub = await follow(Pool([pod("a", pub.endpoint)]), sink)
    try:
        await until_live(pub, sub.received, "a")
        for n in range(1, 6):
            await pub.publish(batch([stored([n], [n] * 16)], shape))
        await pub.publish(batch([cleared()], shape))
        await eventually(
            lambda: any(isinstance(e, AllBlocksCleared) for _, b in sink.batches for e in b.events)
        )
        assert sink.tokens() == [1, 2, 3, 4, 5]
        assert {p for p, _ in sink.batches} == {"a"}
        assert sub.stats.gaps == 0
    finally:
        await sub.stop()
        await pub.close()


async def test_a_gap_is_replayed_in_order(ctx: zmq.asyncio.Context) -> None:
    pub = Publisher(ctx, replay=True)
    sink = Sink()
    sub = await follow(Pool([pod("a", pub.endpoint)]), sink)
    try:
        await until_live(pub, sub.received, "a")
        await pub.publish(ev(1))
        await pub.publish(ev(2), send=False)
        await pub.publish(ev(3), send=False)
        await pub.publish(ev(4))
        await eventually(lambda: 4 in sink.tokens())
        assert sink.tokens() == [1, 2, 3, 4]
        assert (sub.stats.gaps, sub.stats.replayed_batches, sub.stats.missed_batches) == (1, 2, 0)
        assert len(pub.replay_requests) == 1
    finally:
        await sub.stop()
        await pub.close()


async def test_a_gap_without_replay_is_counted(ctx: zmq.asyncio.Context) -> None:
    pub = Publisher(ctx, replay=False)
    sink = Sink()
    sub = await follow(Pool([pod("a", pub.endpoint)]), sink, replay_timeout=0.2)
    try:
        await until_live(pub, sub.received, "a")
        await pub.publish(ev(1))
        await pub.publish(ev(2), send=False)
        await pub.publish(ev(3))
        await eventually(lambda: 3 in sink.tokens())
        assert sink.tokens() == [1, 3]
        assert (sub.stats.gaps, sub.stats.missed_batches) == (1, 1)
        # the replay socket is not asked again for a while: the next gap is counted at once
        await pub.publish(ev(4), send=False)
        await pub.publish(ev(5))
        await eventually(lambda: 5 in sink.tokens(), within=0.15)
        assert sub.stats.missed_batches == 2
    finally:
        await sub.stop()
        await pub.close()


async def test_a_restarted_publisher_makes_the_pod_forgotten(ctx: zmq.asyncio.Context) -> None:
    pub = Publisher(ctx, replay=False)
    sink = Sink()
    sub = await follow(Pool([pod("a", pub.endpoint)]), sink)
    try:
        await until_live(pub, sub.received, "a")
        await pub.publish(ev(1))
        await pub.publish(ev(2), seq=0)  # seq went back: a new publisher
        await eventually(lambda: 2 in sink.tokens())
        assert sink.forgotten == ["a"] and sub.stats.publisher_restarts == 1
    finally:
        await sub.stop()
        await pub.close()


async def test_a_bound_socket_names_pods_by_topic(ctx: zmq.asyncio.Context) -> None:
    pool = Pool([pod("vllm-0", host="10.0.0.7"), pod("vllm-1", host="10.0.0.8")])
    sink = Sink()
    sub = await follow(pool, sink, zmq_endpoint="tcp://127.0.0.1:*", discover_pods=False)
    assert sub.bound_endpoint is not None and sub.subscriptions() == {}
    pushers = []
    try:
        for topic in ("kv@vllm-0@m", "kv@10.0.0.8@m", "kv@stranger@m"):
            p = ctx.socket(zmq.PUB)
            p.setsockopt(zmq.LINGER, 0)
            p.connect(sub.bound_endpoint)
            pushers.append((topic, p))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        seqs = dict.fromkeys(range(3), 0)
        while len(sub.received) < 3:
            assert loop.time() < deadline
            for i, (topic, p) in enumerate(pushers):
                await p.send_multipart([topic.encode(), seqs[i].to_bytes(8, "big"), batch([])])
                seqs[i] += 1
            await asyncio.sleep(0.02)
        assert set(sub.received) == {"vllm-0", "vllm-1", "stranger"}
        assert sub.stats.gaps == 0
    finally:
        for _, p in pushers:
            p.close(0)
        await sub.stop()


async def test_pods_joining_and_leaving(ctx: zmq.asyncio.Context) -> None:
    pub = Publisher(ctx, replay=False)
    pool = Pool([pod("a", pub.endpoint)])
    sink = Sink()
    sub = await follow(pool, sink, reconcile_interval=0.05, socket_port=6123)
    try:
        await until_live(pub, sub.received, "a")
        pool.list = [pod("b", host="10.1.2.3")]
        await eventually(lambda: "a" in sink.forgotten)
        assert sub.subscriptions() == {"b": "tcp://10.1.2.3:6123"}
    finally:
        await sub.stop()
        await pub.close()
    assert replay_endpoint("tcp://h:5557", 1) == "tcp://h:5558"
    assert replay_endpoint("tcp://[::1]:5557", 2) == "tcp://[::1]:5559"
    assert replay_endpoint("ipc:///tmp/x", 1) is None
    assert replay_endpoint("tcp://h:5557", 0) is None


async def test_batches_prepared_in_a_worker_process_keep_their_order(
    ctx: zmq.asyncio.Context,
) -> None:
    """Decoding and hashing in a worker process (the plugin's default on a multi-CPU
    machine): stored, undecodable and restart-forget items still apply in arrival order."""
    seed = namespace_seed("m")
    first_local = {local_hashes([n] * 16, 16, seed)[0]: n for n in range(1, 5)}
    log: list[Any] = []

    async def apply(pod_name: str, b: EventBatch) -> None:
        for e in b.events:
            assert isinstance(e, BlockStored) and e.token_ids == [] and e.local_hashes
            log.append(first_local[e.local_hashes[0]])

    async def forget(pod_name: str) -> None:
        log.append(f"forget {pod_name}")

    preparer = EventPreparer(16, "m", processes=1)
    pub = Publisher(ctx, replay=False)
    sub = KVEventsSubscriber(
        SubscriberOptions(), Pool([pod("a", pub.endpoint)]), apply, forget,
        prepare=preparer.prepare,
    )  # fmt: skip
    await sub.start()
    try:
        await until_live(pub, sub.received, "a")
        log.clear()
        await pub.publish(ev(1))
        await pub.publish(b"\xc1 not msgpack")
        await pub.publish(ev(2))
        await pub.publish(ev(3), seq=0)  # seq went back: a new publisher
        await pub.publish(ev(4))
        await eventually(lambda: 4 in log)
        assert log == [1, 2, "forget a", 3, 4]
        assert sub.stats.decode_errors == 1
    finally:
        await sub.stop()
        await preparer.close()
        await pub.close()


async def test_a_duplicate_window_tells_duplicates_from_restarts(
    ctx: zmq.asyncio.Context,
) -> None:
    """With duplicate_window, a batch seen again is dropped (the pod kept); a sequence that
    goes back to 0 is still a restart; and the replay socket is the one replay_address
    names, not the publisher's port + offset."""
    pub = Publisher(ctx, replay=True)
    sink = Sink()
    asked: list[tuple[str, str]] = []

    def nowhere(pod_name: str, endpoint: str) -> str | None:
        asked.append((pod_name, endpoint))
        return None

    sub = KVEventsSubscriber(
        SubscriberOptions(duplicate_window=8), Pool([pod("a", pub.endpoint)]), sink.apply,
        sink.forget, replay_address=nowhere,
    )  # fmt: skip
    await sub.start()
    try:
        await until_live(pub, sub.received, "a")
        await pub.publish(ev(1))
        await pub.publish(ev(2), seq=pub.seq - 1)  # the same sequence number again
        await pub.publish(ev(3))
        await eventually(lambda: 3 in sink.tokens())
        assert sink.tokens() == [1, 3] and sink.forgotten == []
        assert sub.stats.duplicate_batches == 1 and sub.stats.publisher_restarts == 0
        await pub.publish(ev(4), send=False)
        await pub.publish(ev(5))
        await eventually(lambda: 5 in sink.tokens())
        assert asked == [("a", pub.endpoint)] and pub.replay_requests == []
        await pub.publish(ev(6), seq=0)
        await eventually(lambda: 6 in sink.tokens())
        assert sink.forgotten == ["a"] and sub.stats.publisher_restarts == 1
    finally:
        await sub.stop()
        await pub.close()


async def test_stop_ends_a_worker_whose_apply_absorbed_the_cancellation(
    ctx: zmq.asyncio.Context,
) -> None:
    """A client library on the apply path that swallows the CancelledError stop() sends (seen
    with the Redis index) must not leave stop() waiting for the next batch forever."""
    pub = Publisher(ctx, replay=False)
    entered = asyncio.Event()

    async def absorbing(pod_name: str, b: EventBatch) -> None:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):  # what such a library does
            await asyncio.sleep(30)

    async def forget(pod_name: str) -> None:
        pass

    sub = KVEventsSubscriber(SubscriberOptions(), Pool([pod("a", pub.endpoint)]), absorbing, forget)
    await sub.start()
    try:
        for n in range(50):
            await pub.publish(ev(n))
            if entered.is_set():
                break
            await asyncio.sleep(0.05)
        await asyncio.wait_for(entered.wait(), 5)
        await asyncio.wait_for(sub.stop(), 3)  # well inside STOP_TIMEOUT: the worker ended
    finally:
        await pub.close()


@pytest.mark.slow
async def test_a_thousand_and_more_pods_are_all_followed(ctx: zmq.asyncio.Context) -> None:
    # libzmq's default of 1,023 sockets per context used to fail every subscription past it.
    # A connection takes a descriptor: raise the soft limit as the CLI does.
    raise_open_files_limit()
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 4 * 1100:
        pytest.skip("the open files limit cannot be raised to what 1,100 sockets take")
    pub = Publisher(ctx, replay=False, topic="kv@last@m")  # the shared socket reads the pod
    silent = [pod(f"p{i}", "tcp://127.0.0.1:9") for i in range(1100)]  # nothing listens
    sink = Sink()
    sub = await follow(Pool([*silent, pod("last", pub.endpoint)]), sink, replay_port_offset=0)
    try:
        await until_live(pub, sub.received, "last", within=20.0)
        await pub.publish(ev(7))
        await eventually(lambda: sink.tokens() == [7])
    finally:
        await sub.stop()
        await pub.close()


async def test_a_long_burst_lets_the_loop_run_between_slices() -> None:
    """Applying a drained burst yields to the event loop every APPLY_SLICE: requests and
    queries on the same loop are not held for the whole burst (~16 ms for 256 batches)."""
    applied: list[str] = []

    async def slow_apply(pod_name: str, b: EventBatch) -> None:
        end = time.perf_counter() + 2 * APPLY_SLICE  # every batch outlasts a slice
        while time.perf_counter() < end:
            pass
        applied.append(pod_name)

    async def forget(pod_name: str) -> None:
        pass

    options = SubscriberOptions(discover_pods=False, concurrency=1)
    sub = KVEventsSubscriber(options, Pool([]), slow_apply, forget)
    await sub.start()
    try:
        for n in range(20):
            await sub.feed("a", ev(n))
        seen: list[int] = []

        async def meanwhile() -> None:
            seen.append(len(applied))

        other = asyncio.create_task(meanwhile())  # queued behind the worker's wake-up
        await sub.drain()
        await other
        assert len(applied) == 20 and seen and seen[0] < 20
    finally:
        await sub.stop()


@pytest.mark.slow
async def test_a_failing_subscription_backs_off_and_logs_its_recovery_once(
    ctx: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    def records(level: int) -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.levelno == level and "subscription of a " in r.getMessage()
        ]

    caplog.set_level(logging.DEBUG, logger="heimdall_proxy.kvcache.subscriber")
    pool = Pool([pod("a", "tcp://127.0.0.1")])  # no port: ZMQ refuses the address
    sub = await follow(pool, Sink(), retry_interval=0.02, retry_max=0.08)
    pub = Publisher(ctx, replay=False)
    try:
        await eventually(lambda: len(records(logging.DEBUG)) >= 5)
        failures = [
            r
            for r in caplog.records
            if r.levelno in (logging.DEBUG, logging.WARNING)
            and "subscription of a " in r.getMessage()
        ]
        # a warning for the first failure and for the one that reached the cap, debug between
        levels = [r.levelno for r in failures[:6]]
        assert levels == [logging.WARNING, logging.DEBUG, logging.WARNING, *[logging.DEBUG] * 3]
        assert "still failing after 3 attempts" in failures[2].getMessage()
        waits = [
            float(re.findall(r"retrying (?:in|every) ([0-9.]+)s", r.getMessage())[0])
            for r in failures
        ]
        assert waits[:6] == [0.02, 0.04, 0.08, 0.08, 0.08, 0.08]
        # each attempt really waited for the one before it
        gaps = [b.created - a.created for a, b in itertools.pairwise(failures[:5])]
        assert all(gap >= wait * 0.9 for gap, wait in zip(gaps, waits, strict=False))
        assert not records(logging.INFO)  # no recovery yet

        pool.list = [pod("a", "tcp://127.0.0.2")]  # another bad address: a run of its own
        sub.reconcile()
        await eventually(lambda: "127.0.0.2" in records(logging.WARNING)[-1].getMessage())
        assert "failed: " in records(logging.WARNING)[-1].getMessage()  # a first failure
        pool.list = [pod("a", pub.endpoint)]  # the address fixed: the run ends with a message
        sub.reconcile()
        await until_live(pub, sub.received, "a")
        failed = sum(
            "127.0.0.2" in r.getMessage() for r in records(logging.WARNING) + records(logging.DEBUG)
        )
        recovered = records(logging.INFO)
        assert len(recovered) == 1
        # the first message ends the run, and the count is the former address's
        expected = f"receives ({failed} failure(s) at its former address tcp://127.0.0.2)"
        assert expected in recovered[0].getMessage()
        n = len(caplog.records)
        await asyncio.sleep(0.2)  # longer than the cap: nothing fails or recovers any more
        assert not [r for r in caplog.records[n:] if "subscription of a " in r.getMessage()]
    finally:
        await sub.stop()
        await pub.close()


async def test_malformed_events_are_skipped_and_said_once_per_pod(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Sink()
    sub = KVEventsSubscriber(
        SubscriberOptions(discover_pods=False), Pool([]), sink.apply, sink.forget
    )
    await sub.start()
    try:
        bad = batch([stored([1], [1] * 16, lora_name=3), stored([2], [2] * 16)])  # type: ignore[arg-type]
        with caplog.at_level(logging.DEBUG, "heimdall_proxy.kvcache"):
            for _ in range(3):
                await sub.feed("a", bad)
            await sub.drain()
        assert sub.stats.invalid_events == 3 and len(sink.tokens()) == 3  # the good ones apply
        warned = [r for r in caplog.records if "malformed event(s) skipped" in r.getMessage()]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
        assert any("lora_name must be a string" in r.getMessage() for r in caplog.records)
    finally:
        await sub.stop()
