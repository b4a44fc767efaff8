"""The queue price the in-flight ledger learns from its own attempts (queue_price.py): fed by
the request path's three calls (acquire, prompt_done, release), forgotten with the pods that
leave, expired with the attempts, one object per starting rate across reloads. The clock is
a fake one (time.monotonic patched), so the delays are exact."""

from __future__ import annotations

import time

import pytest

from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.queue_delay import counted_share
from heimdall_proxy.framework.queue_price import QueuePrice
from heimdall_proxy.framework.types import Metrics
from tests.plugins.helpers import ctx, req, sent
from tests.plugins.prefix_affinity.test_prefix_affinity import PODS, make, names, occupy, state

NOMINAL = 1.0 / 16000


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "monotonic", c)
    return c


def teach(load: InFlightLoad, clock: Clock, pod: str, n: int, per_token: float) -> None:
    """`n` streamed attempts on `pod`, each behind one 4000-token prompt kept in flight, whose
    first chunk came `per_token` seconds per token ahead after their own 100-token prefill."""
    load.acquire("blocker-" + pod, pod, whole=4000)
    for i in range(n):
        key = f"{pod}-{i}"
        load.acquire(key, pod, prompt=100, whole=100)
        clock.now += 100 * NOMINAL + 4000 * per_token
        load.prompt_done(key)
        load.release(key)
    load.release("blocker-" + pod)


def test_the_ledger_learns_the_price_from_first_chunks(clock: Clock) -> None:
    load = InFlightLoad()
    price = load.queue_price(NOMINAL)
    assert load.count_tokens  # its samples need each attempt's uncached prompt
    assert price.price("p0") == NOMINAL  # nothing learned: the nominal rate
    teach(load, clock, "p0", 6, 1e-3)
    assert price.price("p0") == pytest.approx(1e-3)
    assert price.price("p1") == pytest.approx(1e-3)  # a pod without samples: the fleet's
    assert not price.waiting


def test_what_ends_without_a_first_chunk_teaches_nothing(clock: Clock) -> None:
    load = InFlightLoad()
    price = load.queue_price(NOMINAL)
    load.acquire("ahead", "p0", whole=4000)
    for i in range(6):  # whole answers: released, never prompt_done
        load.acquire(f"k{i}", "p0", prompt=100, whole=100)
        clock.now += 5.0
        load.release(f"k{i}")
    load.release("ahead")
    assert not price.waiting
    assert price.price("p0") == NOMINAL


def test_expired_attempts_and_pods_that_leave_are_forgotten(clock: Clock) -> None:
    load = InFlightLoad(timeout=10.0)
    price = load.queue_price(NOMINAL)
    teach(load, clock, "p0", 6, 1e-3)
    teach(load, clock, "p1", 6, 3e-3)
    load.acquire("old", "p0", whole=10)
    clock.now += 11.0
    load.expire()
    assert not price.waiting  # the expired attempt is no longer waited on
    load.acquire("going", "p1", whole=10)
    load.forget({"p1"})
    assert not price.waiting
    # p1 came back as a fresh server: it borrows the fleet's price until it has its own
    assert price.price("p1") == pytest.approx(price.price("p9"))
    assert price.price("p0") == pytest.approx(1e-3)


def test_one_price_per_starting_rate_whoever_asks() -> None:
    load = InFlightLoad()
    a = load.queue_price(NOMINAL)
    assert load.queue_price(NOMINAL) is a  # a reload's filter reads the same price
    b = load.queue_price(1.0 / 4000)
    assert b is not a and b.nominal == 1.0 / 4000
    assert load.queue_prices() == [a, b]


def test_no_price_is_fed_until_one_is_asked_for(clock: Clock) -> None:
    load = InFlightLoad()
    load.acquire("k", "p0", prompt=10, whole=10)
    load.prompt_done("k")
    assert load.queue_prices() == []


def test_the_samples_go_to_the_journal_and_the_others_are_applied(clock: Clock) -> None:
    sent_records: list[list[object]] = []

    class Journal:
        def append(self, record: list[object], *, poke: bool = True) -> None:
            assert poke is False  # rides on the next tick
            sent_records.append(record)

    load = InFlightLoad()
    price = load.queue_price(NOMINAL)
    price.share(Journal())
    teach(load, clock, "p0", 2, 1e-3)
    assert [r[0] for r in sent_records] == ["p0", "p0"]
    other = QueuePrice(NOMINAL)
    for record in sent_records * 3:
        other.learned(record)
    assert other.price("p0") == pytest.approx(1e-3)


async def test_first_tokens_teach_the_filter_to_release_sooner(clock: Clock) -> None:
    # At the prefill price (16,000 tokens/s) a warm pod two prompts busier than an idle cold
    # one stays sticky under a 200 ms margin; once first chunks showed each queued prompt
    # token costing 1 ms there, it is released. The filter learns nothing itself: the ledger
    # it reads does, from what the relay feeds it.
    f = make(maxTTFTPenaltyMs=200)
    s = state({"a": 100.0})
    await occupy(f, 0, 2)
    assert names(f.filter(s, req(), PODS)) == ["a"]
    for i in range(6):  # streamed requests on "a", each behind the 3200 tokens in flight
        c = ctx(req(data={"stream": True, "j": i}), PODS[0], attempt=100 + i)
        c.state.update(state({}, 1600))
        await f.pre_request(sent(f.load, c))
        clock.now += 1600 * NOMINAL + 3200 * 1e-3
        f.load.prompt_done(c.key)
        await f.response_complete(c)
        f.load.release(c.key)
    assert f.queue_price is f.load.queue_price(NOMINAL)
    assert f.queue_price.price("a") == pytest.approx(1e-3, rel=0.05)
    assert names(f.filter(s, req(), PODS)) == ["a", "b", "c"]


async def test_a_filter_that_learns_nothing_asks_for_no_price(clock: Clock) -> None:
    f = make(learnQueueDelay=False)
    await occupy(f, 0, 1)
    assert f.queue_price is None and f.load.queue_prices() == []
    assert f.estimated_ttft("a", None, 0) == pytest.approx(1600 * NOMINAL)


def test_on_a_pod_with_two_slots_the_replay_foresees_each_wait(clock: Clock) -> None:
    # A pod running two requests at once, each for 0.9 s after its 2000-token prefill, fed
    # Poisson arrivals through the ledger as the relay would (acquire, first chunk, end).
    # Once the service time and the free depth are learned, the wait it foresees for each
    # new request is within a prefill of the one the pod then gives it, which a price per
    # token cannot know (it sees how much is ahead, not how soon it ends).
    import heapq
    import random

    rng = random.Random(3)
    load = InFlightLoad()
    price = load.queue_price(NOMINAL)
    own = 2000 * NOMINAL
    slots = [0.0, 0.0]
    events: list[tuple[float, int, int]] = []
    starts: dict[int, float] = {}
    at = 0.0
    for i in range(300):
        at += rng.expovariate(1.8)
        start = max(at, heapq.heappop(slots))
        heapq.heappush(slots, start + own + 0.9)
        starts[i] = start
        events += [(at, 0, i), (start + own, 1, i), (start + own + 0.9, 2, i)]
    misses: list[float] = []
    flat: list[float] = []
    for when, kind, i in sorted(events):
        clock.now = when
        key = str(i)
        if kind == 0:
            if i >= 100:
                foreseen = price.wait("p", load.prompts.get("p", 0), load.requests.get("p", 0),
                                      load.keys_on("p"))  # fmt: skip
                misses.append(abs(foreseen - (starts[i] - when)))
                fitted = price.fitted("p")
                assert fitted is not None
                share = counted_share(load.requests.get("p", 0), fitted.depth)
                priced = load.prompts.get("p", 0) * share * fitted.price
                flat.append(abs(priced - (starts[i] - when)))
            load.acquire(key, "p", prompt=2000, whole=2000)
        elif kind == 1:
            load.prompt_done(key)
        else:
            load.release(key)
    fitted = price.fitted("p")
    assert fitted is not None and fitted.depth == 1 and fitted.replay
    assert price.service.of("p") == pytest.approx(own + 0.9)
    # Off by at most a prefill: a request still prefilling (no first chunk yet) is taken to
    # hold its slot for a whole service time from now.
    assert max(misses) <= own + 1e-9
    assert sum(flat) > 20 * sum(misses)


def test_a_pods_slots_are_never_fewer_than_the_attempts_seen_streaming_there_at_once(
    clock: Clock,
) -> None:
    load = InFlightLoad()
    price = load.queue_price(NOMINAL)
    # one request ahead always delays (as on LoRA traffic, where the wait is for an adapter
    # slot): the free depth reads 0, a one-slot pod
    for _ in range(8):
        price.service.observe("p", 1.0)
        price.delay.observe("p", 100.0, 0.8, 1, 0.8)
    assert price.fitted("p") is not None and price.fitted("p").depth == 0  # type: ignore[union-attr]
    assert price.slots("p") == 1
    # yet two of its attempts were seen streaming at the same time
    for key in ("a", "b"):
        load.acquire(key, "p", prompt=10, whole=10)
    load.prompt_done("a")
    load.prompt_done("b")
    load.release("a")
    load.release("b")
    assert price.slots("p") == 2
    # back under the same name, a fresh server: the fleet's depth, no peak of its own
    load.forget({"p"})
    assert price.slots("p") == 1
    # nothing seen to queue: as many as it is sent
    assert QueuePrice(NOMINAL).slots("p") is None


def full(running: int, waiting: int, **lora: object) -> Metrics:
    return Metrics(waiting=waiting, running=running, **lora)  # type: ignore[arg-type]


def test_a_pods_engine_seen_full_in_two_scrapes_in_a_row_gives_its_slots(clock: Clock) -> None:
    load = InFlightLoad()
    price = load.queue_price(NOMINAL)
    load.scraped("p", full(2, 1))
    # one scrape is not enough: vLLM holds a new request as waiting until its next step
    assert load.slots_seen("p") is None and price.slots("p") is None
    load.scraped("p", full(2, 3))
    assert load.slots_seen("p") == 2 and price.slots("p") == 2
    # before any first token, a request behind it is priced by the replay of two slots
    fitted = price.fitted("p")
    assert fitted is not None and (fitted.depth, fitted.bounded, fitted.replay) == (1, True, True)
    assert fitted.price == NOMINAL
    # a different count running breaks the pair; the next pair says the new count
    load.scraped("p", full(3, 1))
    assert load.slots_seen("p") == 2
    load.scraped("p", full(3, 1))
    assert load.slots_seen("p") == 3
    # nothing waiting in between: the pair starts over, and q was seen running 4, more than
    # the fleet's 3
    load.scraped("q", full(4, 1))
    load.scraped("q", full(4, 0))
    load.scraped("q", full(4, 1))
    assert load.slots_seen("q") is None
    # a pod not seen full yet runs what another was seen full at (pods are mostly alike),
    # unless its scrapes showed it running more
    load.scraped("r", full(2, 0))
    assert load.slots_seen("r") == 3 and load.slots_seen("never-scraped") == 3
    # back under the same name, a fresh server: the fleet's, no count of its own
    load.scraped("p", full(2, 1))
    load.forget({"p"})
    load.scraped("p", full(2, 1))
    assert load.slots_seen("p") == 3


def test_a_request_waiting_for_a_lora_adapter_slot_says_nothing_of_the_slots() -> None:
    load = InFlightLoad()
    for _ in range(3):  # lora-b waits for lora-a's adapter slot, one request running
        load.scraped("p", full(1, 1, lora_running=("lora-a",), lora_waiting=("lora-b",)))
    assert load.slots_seen("p") is None
    for _ in range(2):  # the waiting requests' adapter is loaded: they wait for a slot
        load.scraped("p", full(1, 1, lora_running=("lora-a",), lora_waiting=("lora-a",)))
    assert load.slots_seen("p") == 1


def test_the_slots_seen_correct_a_free_depth_learned_too_deep(clock: Clock) -> None:
    load = InFlightLoad()
    price = load.queue_price(NOMINAL)
    # first tokens only ever came at once with up to three ahead: the depth reads 3 (or more)
    for requests in (1, 2, 3) * 4:
        price.service.observe("p", 1.0)
        price.delay.observe("p", 100.0 * requests, 0.0, requests, 0.0)
    fitted = price.fitted("p")
    assert fitted is not None and fitted.depth >= 3
    load.scraped("p", full(2, 1))
    load.scraped("p", full(2, 1))
    fitted = price.fitted("p")
    assert fitted is not None and (fitted.depth, fitted.bounded) == (1, True)
    # its engine runs 2: the third request in flight waits for a slot to free
    for key in ("a", "b"):
        load.acquire(key, "p", prompt=10, whole=10)
        load.prompt_done(key)
    wait = price.wait("p", 0.0, 2, load.keys_on("p"))
    assert wait == pytest.approx(1.0, abs=0.05)
    # a pod that runs more than the fit counts is left to its first tokens
    load.scraped("big", full(64, 5))
    load.scraped("big", full(64, 5))
    assert price.slots("big") == 64
    assert price.fitted("big") == price.fitted("elsewhere")


def test_a_pod_seen_full_is_replayed_from_the_first_attempt_that_ends_anywhere(
    clock: Clock,
) -> None:
    load = InFlightLoad()
    price = load.queue_price(NOMINAL)
    load.scraped("p", full(2, 1))
    load.scraped("p", full(2, 1))
    # a few first tokens on p that the price foresaw better than the replay did
    for _ in range(10):
        price.delay.observe("p", 2000.0, 0.05, 2, predicted=1.0)
    # two attempts streaming on p (started 0.7 s and 0.5 s ago), one queued behind them
    for key in ("a", "b"):
        load.acquire(key, "p", prompt=10, whole=10)
        load.prompt_done(key)
        clock.now += 0.2
    load.acquire("c", "p", prompt=10, whole=10)
    clock.now += 0.3
    ahead, requests = load.prompts["p"], load.requests["p"]
    # no attempt has ended yet: no service time, the (low) price stands
    assert price.wait("p", ahead, requests, load.keys_on("p")) < 0.1
    # one attempt ends on another pod after 1 s: p's replay borrows that service time. The
    # queued one takes the slot a frees in 0.3 s; a new request waits for b's, 0.5 s.
    price.service.observe("q", 1.0)
    wait = price.wait("p", ahead, requests, load.keys_on("p"))
    assert wait == pytest.approx(0.5, abs=0.01)
