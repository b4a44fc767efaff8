"""prefix-cache-affinity-filter's picks pinned on fixed request sequences: recorded before the
learned queue price and the prefix popularity moved out of the filter to their owners (the
in-flight ledger, framework/queue_price.py; framework/popularity.py), and must not change
with a refactoring. Re-recorded once since, on purpose: when the queue price learned the pods'
free depth and the replay of their slots (framework/queue_delay.py, service_time.py), three
cases changed in their later picks.

The clock is a fake one (time.monotonic patched, advanced by hand), so the queue price is
learned from the same delays on every run; each streamed request's first chunk and end come
a fixed number of steps after it was sent, fed in the relay's order (the ledger, then the
response hooks)."""

from __future__ import annotations

import random
import time
from collections import deque
from typing import Any

import pytest
import yaml

from heimdall_proxy.config.build import build_plugins
from heimdall_proxy.config.gateway import parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import CycleState, InferenceRequest, RequestContext
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.requesthandling.usage import sse_events
from tests.helpers import ep
from tests.plugins.helpers import req, sent

PODS = [ep("pod-0"), ep("pod-1"), ep("pod-2"), ep("pod-3")]

BASE = """
plugins:
- type: prefix-cache-scorer
- type: prefix-cache-affinity-filter
  parameters: {}
- type: outstanding-work-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: outstanding-work-scorer
    weight: 4
  - pluginRef: max-score-picker
"""


def requests() -> list[InferenceRequest]:
    """Three shared system prompts of different lengths and one-off prompts, user turns
    appended, streamed and not, chat and completions mixed."""
    rng = random.Random(11)
    words = [f"w{i}" for i in range(400)]
    systems = [" ".join(rng.choice(words) for _ in range(n)) for n in (200, 900, 2500)]
    out: list[InferenceRequest] = []
    for i in range(90):
        user = " ".join(rng.choice(words) for _ in range(rng.randrange(5, 150)))
        pick = rng.randrange(5)
        system = systems[pick] if pick < 3 else " ".join(rng.choice(words) for _ in range(600))
        stream = rng.random() < 0.7
        if i % 3:
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            out.append(req("chat", {"messages": msgs, "stream": stream}))
        else:
            out.append(req("completions", {"prompt": system + " " + user, "stream": stream}))
        out[-1].request_id = f"r{i}"
    return out


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def route_all(params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    doc = yaml.safe_load(BASE)
    doc["plugins"][1]["parameters"] = params
    doc["endpoints"] = [{"name": p.name, "url": p.url} for p in PODS]
    cfg = parse_config(doc, "pin.yaml")
    load = InFlightLoad()
    handle = PluginHandle(EndpointPool(cfg.endpoints), load=load)
    pset = build_plugins(cfg.epp, load_builtin_plugins(), handle)
    for profile in pset.scheduler.profiles.values():
        profile.picker.rng.seed(2024)  # type: ignore[attr-defined]
    rng = random.Random(5)
    #: (step due, what, ctx): first chunks and ends still to come
    pending: deque[tuple[int, str, RequestContext]] = deque()
    picks: list[str] = []
    chunk = b'data: {"choices": [{"text": "x"}]}\n\n'

    async def due(step: int) -> None:
        for item in sorted(pending, key=lambda x: (x[0], x[1] == "end")):
            at, what, c = item
            if at > step:
                continue
            pending.remove(item)
            if what == "first":
                load.prompt_done(c.key)  # the relay's order: the ledger, then the hooks
                c.events = sse_events(chunk)
                for hook in pset.response_streaming:
                    await hook.response_streaming(c, chunk)
            else:
                for done in pset.response_complete:
                    await done.response_complete(c)
                load.release(c.key)

    for step, request in enumerate(requests()):
        clock.now += 0.4
        await due(step)
        state = CycleState()
        for producer in pset.producers:
            await producer.produce(state, request, PODS)
        result = pset.scheduler.schedule(state, request, PODS)
        target = result.primary.targets[0]
        c = RequestContext(request, state, result, target)
        sent(load, c)
        for plugin in pset.pre_request:
            await plugin.pre_request(c)
        picks.append(target.name[-1])
        life = 2 + rng.randrange(8)
        if request.data.get("stream") is True:
            pending.append((step + 1 + rng.randrange(life), "first", c))
        pending.append((step + life, "end", c))
    return "".join(picks)


PINNED: dict[str, tuple[dict[str, Any], str]] = {
    "defaults": (
        {},
        "302121230221132203231000213020122300321130220213231202300110232103203110302211320013231300",
    ),
    "recommended": (
        {"maxTTFTPenaltyMs": 400, "sharedPrefixDiscount": 0.75},
        "302121230221132203231000213020122300321130220213231202300110232103203110302211320013231300",
    ),
    "discount": (
        {"maxTTFTPenaltyMs": 2000, "sharedPrefixDiscount": 1.0},
        "302121230221132203231200213020122300321130220213231202300110232103203110302211320013231300",
    ),
    "half-life": (
        {"maxTTFTPenaltyMs": 2000, "sharedPrefixDiscount": 1.0, "popularityHalfLife": 8},
        "302121230221132203231200213020122300321130220213231220323121230213013223130022103312021203",
    ),
    "slow-prefill": (
        {"maxTTFTPenaltyMs": 400, "peakPrefillThroughput": 4000},
        "302121230221132203231000213020122300321130220213231220323121030213013223130022103312021203",
    ),
    "no-learning": (
        {"maxTTFTPenaltyMs": 20, "learnQueueDelay": False},
        "302121230221132203231000213020122300321130220213231202300110232103203110302211203301210213",
    ),
    "ratio": (
        {"maxTTFTPenaltyMs": 0, "maxTTFTPenaltyRatio": 0.3},
        "302121230221132203231000213020122300321130220213231202300110232103203110302211320013231300",
    ),
}


@pytest.mark.parametrize("case", sorted(PINNED))
async def test_the_picks_are_pinned(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    params, expected = PINNED[case]
    assert await route_all(params, monkeypatch) == expected
