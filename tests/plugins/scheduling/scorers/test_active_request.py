"""active-request-scorer: in-flight counts per pod, idle threshold, busy scaling, timeouts."""

from __future__ import annotations

import random
import time

import pytest

from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.active_request import (
    ActiveRequestParams,
    ActiveRequestScorer,
)
from tests.helpers import ep
from tests.plugins.helpers import req


def make(**params: object) -> ActiveRequestScorer:
    handle = PluginHandle(EndpointPool([]), load=InFlightLoad())
    return ActiveRequestScorer("a", ActiveRequestParams.model_validate(params), handle)


def test_counts_are_the_ledgers_and_score() -> None:
    """The scorer keeps no count: what the relay puts in the gateway's ledger is what it
    reads, from dispatch to the attempt's end."""
    scorer = make()
    load = scorer.load
    a, b, c = ep("a"), ep("b"), ep("c")
    keys = [(f"r{i}:0", "a") for i in range(4)] + [(f"s{i}:0", "b") for i in range(2)]
    for key, pod in keys:
        load.acquire(key, pod)
    assert (scorer.count("a"), scorer.count("b"), scorer.count("c")) == (4, 2, 0)
    got = scorer.score(CycleState(), req(), [a, b, c])
    assert got == pytest.approx({"a": 0.0, "b": 0.5, "c": 1.0})
    for key, _ in keys:
        load.release(key)
        load.release(key)  # a second release never drives a count negative
    assert scorer.count("a") == scorer.count("b") == 0
    assert scorer.score(CycleState(), req(), [a, b]) == {"a": 1.0, "b": 1.0}


def test_retry_attempts_are_counted_on_their_own_pod() -> None:
    scorer = make()
    load = scorer.load
    load.acquire("r:0", "a")
    load.release("r:0")
    load.acquire("r:1", "b")
    assert (scorer.count("a"), scorer.count("b")) == (0, 1)


def test_idle_threshold_and_max_busy_score() -> None:
    scorer = make(idleThreshold=1, maxBusyScore=0.5)
    a, b, c = ep("a"), ep("b"), ep("c")
    for pod, n in ((a, 1), (b, 2), (c, 4)):
        for i in range(n):
            scorer.load.acquire(f"{pod.name}{i}:0", pod.name)
    got = scorer.score(CycleState(), req(), [a, b, c])
    assert got == pytest.approx({"a": 1.0, "b": 0.5 * (4 - 2) / 4, "c": 0.0})


def test_requests_older_than_the_timeout_stop_counting_here_only() -> None:
    """requestTimeout keeps its meaning for this scorer; the ledger itself keeps the request
    until it ends (or its own, longer, expiry)."""
    scorer = make(requestTimeout="2m")
    now = time.monotonic()
    scorer.load.acquire("old:0", "a", now=now - 121.0)
    scorer.load.acquire("new:0", "a", now=now)
    assert scorer.count("a") == 1
    assert scorer.load.requests["a"] == 2
    scorer.load.release("new:0")
    assert scorer.count("a") == 0


def test_params_defaults_and_validation() -> None:
    p = ActiveRequestParams.model_validate({})
    assert (p.request_timeout, p.idle_threshold, p.max_busy_score) == (120.0, 0, 1.0)
    assert ActiveRequestParams.model_validate({"requestTimeout": "30s"}).request_timeout == 30.0
    with pytest.raises(ValueError, match="less than or equal"):
        ActiveRequestParams.model_validate({"maxBusyScore": 1.5})


def test_visiting_the_busy_pods_scores_as_every_pod() -> None:
    """Scored from the pods with requests in flight only, every candidate gets what the rule
    gives it pod by pod, after random dispatches and ends, on pods in and out of the
    candidates."""
    rng = random.Random(38)
    for trial in range(50):
        scorer = make(idleThreshold=rng.choice([0, 1, 3]), maxBusyScore=rng.choice([1.0, 0.5]))
        load = scorer.load
        pool = [ep(f"p{i}") for i in range(60)]
        live: list[str] = []
        for k in range(rng.randrange(0, 200)):
            if live and rng.random() < 0.4:
                load.release(live.pop(rng.randrange(len(live))))
            else:
                key = f"r{k}:0"
                load.acquire(key, rng.choice(pool).name)
                live.append(key)
        cands = [e for e in pool if rng.random() < 0.5]
        counts = [scorer.count(e.name) for e in cands]
        top = max(counts, default=0)
        want = {
            e.name: 1.0 if n <= scorer._idle else scorer._busy * (top - n) / top
            for e, n in zip(cands, counts, strict=True)
        }
        assert dict(scorer.score(CycleState(), req(), cands)) == want, trial
