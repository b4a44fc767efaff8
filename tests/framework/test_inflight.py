"""The gateway's one in-flight ledger: attempts in and out, a stream's prompt released at its
first chunk, one expiry, pods that leave forgotten, and a consumer's own horizon."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.inflight import InFlightLoad, LoadEstimate
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_key
from tests.helpers import ep
from tests.plugins.helpers import ctx, req


def test_an_attempts_tokens_and_request_come_and_go() -> None:
    load = InFlightLoad()
    load.acquire("r:0", "a", prompt=100, output=40)
    load.acquire("s:0", "a", prompt=10)
    assert (load.requests["a"], load.tokens["a"], load.sent["a"]) == (2, 150, 2)
    load.prompt_done("r:0")  # the stream's first chunk: prefill is over
    load.prompt_done("r:0")
    assert (load.requests["a"], load.tokens["a"]) == (2, 50)
    load.release("r:0")
    load.release("r:0")  # a second report changes nothing
    assert (load.requests["a"], load.tokens["a"]) == (1, 10)
    load.release("s:0")
    assert load.requests == {} and load.tokens == {} and load.sent["a"] == 2
    load.acquire("r:0", "b")
    load.acquire("r:0", "b")  # one attempt counts once
    assert load.requests["b"] == 1 and "b" not in load.tokens


def test_one_expiry_and_a_consumers_own_horizon() -> None:
    load = InFlightLoad(timeout=600.0)
    load.acquire("old:0", "a", prompt=5, now=0.0)
    load.acquire("mid:0", "a", prompt=5, now=500.0)
    assert load.requests_since("a", cutoff=100.0) == 1  # e.g. active-request's 2m horizon
    assert load.requests["a"] == 2
    load.acquire("new:0", "b", now=700.0)  # a new attempt drops what is past the expiry
    assert (load.requests["a"], load.tokens["a"], load.attempts()) == (1, 5, 2)
    load.expire(now=1200.0)
    assert load.requests == {"b": 1} and load.tokens == {}


def test_pods_that_leave_are_forgotten() -> None:
    load = InFlightLoad()
    load.acquire("r:0", "a", prompt=5)
    load.acquire("s:0", "b", prompt=7)
    load.forget({"a"})
    assert load.requests == {"b": 1} and load.tokens == {"b": 7}
    load.release("r:0")  # its end, reported later, changes nothing
    assert load.requests == {"b": 1} and load.requests_since("a", 0.0) == 0


def test_the_estimate_counts_the_uncached_prompt_and_a_capped_output() -> None:
    r = req("completions", data={"prompt": "x" * 400, "max_tokens": 30})
    r.token_ids = list(range(100))
    c = ctx(r, ep("a"))
    assert LoadEstimate()(c) == (100, 0, 100)  # no prefix match ran: the whole prompt
    c.state[prefix_match_key("approx-prefix-cache-producer", "approx-prefix-cache-producer")] = (
        PrefixCacheMatchInfo(16, 6, 100, {"a": 4.0})
    )
    assert LoadEstimate()(c) == (100 - 64, 0, 100)
    with_output = LoadEstimate(add_output=True)  # 1.5 x 100, but the request caps it at 30
    assert with_output(c) == (36, 30, 100)
    r.data.pop("max_tokens")
    assert with_output(c) == (36, 150, 100)  # from the whole prompt, cached or not
    assert LoadEstimate(add_output=True, output_ratio=0.5, max_output=20)(c) == (36, 20, 100)


def test_a_measure_goes_with_its_attempt() -> None:
    """A consumer's per-attempt value (outstanding work) lives in the ledger: released,
    expired or forgotten with the attempt, and the same object for whoever asks by name."""
    load = InFlightLoad(timeout=600.0)
    work = load.measure("outstanding-work-scorer/w")
    assert load.measure("outstanding-work-scorer/w") is work
    load.acquire("r:0", "a", now=0.0)
    load.acquire("s:0", "a", now=500.0)
    load.acquire("t:0", "b", now=500.0)
    work.put("r:0", "a", 10.0)
    work.put("s:0", "a", 5.0)
    work.put("t:0", "b", 7.0)
    work.put("s:0", "a", 2.0)  # a change of value
    assert work.totals_of(["a", "b", "c"]) == [12.0, 7.0, 0.0]
    load.expire(now=700.0)  # r:0 is past the expiry
    assert work.totals() == {"a": 2.0, "b": 7.0}
    load.release("s:0")
    load.forget({"b"})
    assert work.totals() == {} and work.total("a") == 0.0


def test_the_other_replicas_sums_are_in_every_read_and_only_its_own_are_published() -> None:
    load = InFlightLoad()
    work = load.measure("w")
    load.acquire("k", "p0", prompt=10, output=5, whole=40, now=0.0)
    work.put("k", "p0", 7.0)
    mine = load.published()
    assert mine == {"r\x1fp0": 1.0, "t\x1fp0": 15.0, "p\x1fp0": 40.0, "m:w\x1fp0": 7.0}
    # another replica published the same shape: every reader sums it
    load.share_others({"r\x1fp0": 2.0, "t\x1fp1": 30.0, "p\x1fp0": 100.0, "m:w\x1fp1": 3.0})
    assert load.requests == {"p0": 3} and load.tokens == {"p0": 15, "p1": 30}
    assert load.prompts == {"p0": 140}
    assert work.total("p1") == 3.0 and work.totals_of(["p0", "p1"]) == [7.0, 3.0]
    assert load.requests_since("p0", 1.0) == 2  # the others' have no published start
    assert load.published() == mine  # never the others' back to them
    load.prompt_done("k")
    load.release("k")
    assert load.requests == {"p0": 2} and load.tokens == {"p1": 30}
    assert load.own_requests == {} and load.published() == {}
    load.forget({"p1"})
    assert load.tokens == {} and work.total("p1") == 0.0
    load.share_others({})  # the others gone (or stale): the ledger counts alone again
    assert load.requests == {} and load.requests is load.own_requests


def test_every_send_listener_hears_of_each_send_beside_the_poke() -> None:
    load = InFlightLoad()
    heard: list[str] = []
    pokes: list[None] = []
    load.poke = lambda: pokes.append(None)  # the replica sharing's slot, kept apart
    removers = [load.on_send(lambda pod, i=i: heard.append(f"{i}:{pod}")) for i in range(3)]
    load.acquire("r:0", "a")
    load.acquire("r:0", "a")  # the same attempt again: no send
    load.acquire("s:0", "b")
    assert heard == ["0:a", "1:a", "2:a", "0:b", "1:b", "2:b"]
    assert len(pokes) == 2
    load.prompt_done("r:0")
    load.release("r:0")
    load.release("s:0")
    assert len(heard) == 6 and len(pokes) == 4  # ends are no sends; the poke hears them
    removers[1]()
    removers[1]()  # removing twice is harmless
    load.acquire("t:0", "c")
    assert heard[6:] == ["0:c", "2:c"]


def test_a_rise_in_the_other_replicas_requests_is_a_send() -> None:
    load = InFlightLoad()
    load.acquire("r:0", "a")
    seen: list[tuple[str, int]] = []
    load.on_send(lambda pod: seen.append((pod, load.requests.get(pod, 0))))
    load.share_others({"r\x1fa": 1.0, "r\x1fb": 2.0, "t\x1fc": 5.0})
    assert sorted(seen) == [("a", 2), ("b", 2)]  # told once the sums include the rise
    seen.clear()
    load.share_others({"r\x1fa": 1.0, "r\x1fb": 1.0})  # unchanged, or fewer: no send
    load.share_others({"r\x1fa": 1.2})
    assert seen == []
    load.share_others({"r\x1fa": 2.0})
    assert seen == [("a", 3)]


def test_a_stream_that_ran_to_its_end_teaches_its_pods_pace() -> None:
    load = InFlightLoad()
    pod = ep("a")
    done = ctx(req("completions", {"prompt": "hi"}), pod)
    load.acquire("r:0", "a", now=10.0, ctx=done)
    assert [a.ctx for a in load.attempts_on("a")] == [done]
    done.chunk_arrived(1, 10.5)  # first chunk 0.5 s after the send
    done.chunk_arrived(3, 10.8)  # three more tokens, 0.1 s each
    load.release("r:0")
    pace = load.pace("a")
    assert pace is not None and (pace.ttft, pace.tpot) == (0.5, pytest.approx(0.1))
    assert load.fleet_tpot() == pytest.approx(0.1) and list(load.attempts_on("a")) == []
    # a stream that failed, or a whole answer (no events), teaches nothing
    broken = ctx(req("completions", {"prompt": "hi"}), ep("b"))
    load.acquire("s:0", "b", now=10.0, ctx=broken)
    broken.chunk_arrived(2, 10.2)
    broken.error = "upstream failed mid-stream"
    load.release("s:0")
    whole = ctx(req("completions", {"prompt": "hi"}), ep("b"), attempt=1)
    load.acquire("s:1", "b", now=10.0, ctx=whole)
    load.release("s:1")
    assert load.pace("b") is None
    load.forget({"a"})  # back under the same name, a fresh server
    assert load.pace("a") is None and load.fleet_tpot() is None


def test_a_pace_is_learned_with_the_batch_its_tokens_shared_their_steps_with() -> None:
    load = InFlightLoad()
    pod = ep("a")
    other = ctx(req("completions", {"prompt": "hi"}), pod, attempt=1)
    load.acquire("o:0", "a", now=10.0, ctx=other)
    other.chunk_arrived(1, 10.1)
    load.prompt_done("o:0", 10.1)
    s = ctx(req("completions", {"prompt": "hi"}), pod)
    load.acquire("s:0", "a", prompt=500, now=10.0, ctx=s)
    s.chunk_arrived(1, 10.2)
    load.prompt_done("s:0", 10.2)  # two streams decoding on the pod now (its own prompt done)
    load.release("o:0")  # one by its end
    late = ctx(req("completions", {"prompt": "x"}), pod, attempt=2)
    load.acquire("l:0", "a", prompt=3000, now=10.3, ctx=late)
    load.prompt_done("l:0", 10.4)  # 3,000 prompt tokens prefilled between s's tokens
    load.release("l:0")
    s.chunk_arrived(10, 11.2)
    load.release("s:0")
    pace = load.pace("a")
    assert pace is not None and pace.tpot == pytest.approx(0.1)
    # two at its first token, alone (itself) at its end; 3,000 tokens over 10 token gaps (its
    # own 500 came before its first)
    assert pace.running == pytest.approx(1.5)
    assert pace.prefill_per_token == pytest.approx(300.0)


def test_the_models_that_last_ran_on_a_pod_are_kept_in_order() -> None:
    load = InFlightLoad()
    pod = ep("a")
    for i, model in enumerate(["base", "lora-a", "base", "lora-b"]):
        c = ctx(req("completions", {"prompt": "hi"}, model=model), pod, attempt=i)
        load.acquire(c.key, "a", now=10.0, ctx=c)
        if model != "lora-b":  # lora-b's request never ran: dropped from the queue
            c.chunk_arrived(1, 10.1)
            load.prompt_done(c.key, 10.1)
        load.release(c.key)
    assert list(load.recent_models("a")) == ["lora-a", "base"]
    for i in range(20):  # a bounded memory
        c = ctx(req("completions", {"prompt": "hi"}, model=f"m{i}"), pod, attempt=10 + i)
        load.acquire(c.key, "a", now=11.0, ctx=c)
        load.prompt_done(c.key, 11.1)
        load.release(c.key)
    assert list(load.recent_models("a")) == [f"m{i}" for i in range(12, 20)]
    load.forget({"a"})
    assert list(load.recent_models("a")) == []
