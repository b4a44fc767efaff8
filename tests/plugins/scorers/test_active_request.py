"""active-request-scorer: in-flight counts per pod, idle threshold, busy scaling, timeouts."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scorers.active_request import ActiveRequestParams, ActiveRequestScorer
from tests.helpers import ep
from tests.plugins.helpers import ctx, req


def make(**params: object) -> ActiveRequestScorer:
    return ActiveRequestScorer("a", ActiveRequestParams.model_validate(params), None)  # type: ignore[arg-type]


async def test_counts_follow_the_lifecycle_and_score() -> None:
    scorer = make()
    a, b, c = ep("a"), ep("b"), ep("c")
    ctxs = [ctx(req(), a) for _ in range(4)] + [ctx(req(), b) for _ in range(2)]
    for x in ctxs:
        await scorer.pre_request(x)
    assert (scorer.count("a"), scorer.count("b"), scorer.count("c")) == (4, 2, 0)
    got = scorer.score(CycleState(), req(), [a, b, c])
    assert got == pytest.approx({"a": 0.0, "b": 0.5, "c": 1.0})
    for x in ctxs:
        await scorer.response_complete(x)
        await scorer.response_complete(x)  # a second completion never drives a count negative
    assert scorer.count("a") == scorer.count("b") == 0
    assert scorer.score(CycleState(), req(), [a, b]) == {"a": 1.0, "b": 1.0}


async def test_retry_attempts_are_counted_on_their_own_pod() -> None:
    scorer = make()
    a, b = ep("a"), ep("b")
    r = req()
    first, second = ctx(r, a, attempt=0), ctx(r, b, attempt=1)
    await scorer.pre_request(first)
    await scorer.response_complete(first)
    await scorer.pre_request(second)
    assert (scorer.count("a"), scorer.count("b")) == (0, 1)


async def test_idle_threshold_and_max_busy_score() -> None:
    scorer = make(idleThreshold=1, maxBusyScore=0.5)
    a, b, c = ep("a"), ep("b"), ep("c")
    for pod, n in ((a, 1), (b, 2), (c, 4)):
        for _ in range(n):
            await scorer.pre_request(ctx(req(), pod))
    got = scorer.score(CycleState(), req(), [a, b, c])
    assert got == pytest.approx({"a": 1.0, "b": 0.5 * (4 - 2) / 4, "c": 0.0})


async def test_requests_older_than_the_timeout_stop_counting() -> None:
    scorer = make(requestTimeout="2m")
    a = ep("a")
    old = ctx(req(), a)
    scorer.inflight.add("a", "old:0", now=0.0)  # started long ago
    await scorer.pre_request(old)
    assert scorer.count("a") == 1
    await scorer.response_complete(old)
    assert scorer.count("a") == 0


def test_params_defaults_and_validation() -> None:
    p = ActiveRequestParams.model_validate({})
    assert (p.request_timeout, p.idle_threshold, p.max_busy_score) == (120.0, 0, 1.0)
    assert ActiveRequestParams.model_validate({"requestTimeout": "30s"}).request_timeout == 30.0
    with pytest.raises(ValueError, match="less than or equal"):
        ActiveRequestParams.model_validate({"maxBusyScore": 1.5})
