"""prefix-cache-affinity-filter's decision trace (affinity_trace.py): the filter's view, each
request's start and end, and the queue-price sample the ledger took at its first chunk."""

from __future__ import annotations

import json
import logging

import pytest

from heimdall_proxy.plugins.prefix_affinity import trace as affinity_trace
from tests.plugins.helpers import ctx, req, sent, streamed
from tests.plugins.prefix_affinity.test_prefix_affinity import PODS, make, occupy, state


def records(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    out = []
    for r in caplog.records:
        if r.name == affinity_trace.log.name:
            word, _, payload = r.getMessage().partition(" ")
            assert word == "affinity"
            out.append(json.loads(payload))
    return out


async def test_the_trace_follows_a_request_from_the_filter_to_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    f = make()
    await occupy(f, 0, 1)
    caplog.set_level(affinity_trace.LEVEL, logger=affinity_trace.log.name)
    s = state({"a": 100.0})
    f.filter(s, req(), PODS)
    c = ctx(req(data={"stream": True}), PODS[0], attempt=9)
    c.state = s
    await f.pre_request(sent(f.load, c))
    f.load.prompt_done(c.key)  # the relay at the first chunk: the ledger takes the sample
    for _ in range(2):  # traced once, however many chunks follow
        await streamed(f, c, b'data: {"x": 1}\n\n')
    await f.response_complete(c)
    events = records(caplog)
    assert [e["ev"] for e in events] == ["filter", "start", "first", "end"]
    view = events[0]["view"]
    assert isinstance(view, dict) and set(view) == {"a", "b", "c"}
    assert view["a"][0] == 1600.0  # the prompt tokens in flight there, from the ledger
    first = events[2]
    assert first["id"] == c.key and first["pod"] == "a" and first["ahead"] == 1600.0


async def test_nothing_is_traced_below_its_level(caplog: pytest.LogCaptureFixture) -> None:
    f = make()
    caplog.set_level(logging.INFO)
    c = ctx(req(data={"stream": True}), PODS[0])
    c.state = state({"a": 100.0})
    f.filter(c.state, req(), PODS)
    await f.pre_request(sent(f.load, c))
    f.load.prompt_done(c.key)
    await streamed(f, c, b'data: {"x": 1}\n\n')
    assert records(caplog) == []
