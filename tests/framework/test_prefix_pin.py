"""Routing pinned on fixed request sequences, for the seeds' prefix-cache configs (index
parameters on prefix-cache-scorer, readers naming the scorer): the picks were recorded before
the approximate index moved from prefix-cache-scorer into approx-prefix-cache-producer, and
must not change with it. recommended.yaml's were re-recorded when its maxTTFTPenaltyMs went
from 400 to 150 ms (issue 36): the picks differ from the ninth request on."""

from __future__ import annotations

import random
from pathlib import Path
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
from tests.helpers import ep
from tests.plugins.helpers import req, sent

CONFIG = Path(__file__).resolve().parents[2] / "config"

PODS = [ep("pod-0", waiting=1), ep("pod-1"), ep("pod-2", waiting=2), ep("pod-3")]
PD_PODS = [
    ep("pre-0", {"mif.moreh.io/role": "prefill"}),
    ep("pre-1", {"mif.moreh.io/role": "prefill"}, waiting=1),
    ep("dec-0", {"mif.moreh.io/role": "decode"}),
    ep("dec-1", {"mif.moreh.io/role": "decode"}, waiting=1),
]


def requests() -> list[InferenceRequest]:
    """Four shared system prompts (two longer than 256 blocks of 16 tokens, so the seeds'
    match cap counts), user turns appended, chat and completions mixed."""
    rng = random.Random(7)
    words = [f"w{i}" for i in range(500)]
    systems = [" ".join(rng.choice(words) for _ in range(n)) for n in (120, 300, 4000, 4200)]
    systems[3] = systems[2][:15000] + systems[3][15000:]  # shares 15000 chars with [2]
    out: list[InferenceRequest] = []
    for i in range(48):
        system = systems[rng.randrange(4)]
        user = " ".join(rng.choice(words) for _ in range(rng.randrange(5, 200)))
        if i % 3:
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            out.append(req("chat", {"messages": msgs}))
        else:
            out.append(req("completions", {"prompt": system + user}))
    return out


async def route_all(doc: dict[str, Any], pods: list[Any]) -> list[str]:
    doc = {**doc, "endpoints": [{"name": p.name, "url": p.url} for p in pods]}
    cfg = parse_config(doc, "pin.yaml")
    load = InFlightLoad()
    handle = PluginHandle(EndpointPool(cfg.endpoints), frozenset(cfg.epp.feature_gates), load=load)
    pset = build_plugins(cfg.epp, load_builtin_plugins(), handle)
    for i, profile in enumerate(pset.scheduler.profiles.values()):
        profile.picker.rng.seed(1000 + i)  # type: ignore[attr-defined]
    picks: list[str] = []
    for request in requests():
        state = CycleState()
        for producer in pset.producers:
            await producer.produce(state, request, pods)
        result = pset.scheduler.schedule(state, request, pods)
        target = result.primary.targets[0]
        prefill = result.profile_results.get("prefill")
        c = RequestContext(request, state, result, target)
        if prefill is not None:
            c.prefill = prefill.targets[0]
        sent(load, c)
        for plugin in pset.pre_request:
            await plugin.pre_request(c)
        picks.append(target.name[-1] + (c.prefill.name[-1] if c.prefill else ""))
    return picks


def config_file(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CONFIG / name).read_text())
    doc.pop("endpoints", None)
    return doc


TWO_SCORERS: dict[str, Any] = {
    "plugins": [
        {"type": "queue-scorer"},
        {"name": "fine", "type": "prefix-cache-scorer", "parameters": {"blockSizeTokens": 8}},
        {
            "name": "coarse",
            "type": "prefix-cache-scorer",
            "parameters": {"blockSizeTokens": 64, "maxPrefixBlocksToMatch": 8},
        },
        {
            "type": "no-hit-lru-scorer",
            "parameters": {"prefixPluginType": "prefix-cache-scorer", "prefixPluginName": "coarse"},
        },
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "queue-scorer"},
                {"pluginRef": "fine", "weight": 2},
                {"pluginRef": "coarse", "weight": 3},
                {"pluginRef": "no-hit-lru-scorer"},
            ],
        }
    ],
}

BARE: dict[str, Any] = {
    "plugins": [
        {"type": "prefix-cache-scorer"},
        {"type": "no-hit-lru-scorer"},
        {"type": "kv-cache-utilization-scorer"},
    ]
}

#: The pod each request went to (its name's last character; then the prefill pod's, if any).
PINNED: dict[str, str] = {
    "prefix-cache.yaml": "1 0 3 1 3 3 1 3 3 1 3 3 1 3 3 1 3 3 1 3 3 1 3 3 1 0 3 1 3 3 1 3 3 1 3 3 1 0 0 1 0 0 1 3 3 1 3 3",
    "recommended.yaml": "0 1 2 3 2 1 3 1 3 2 3 2 0 1 3 2 2 1 0 3 2 0 2 1 0 2 2 0 3 1 0 2 3 2 2 1 0 2 2 0 1 2 0 3 1 0 3 2",
    "pd-disagg.yaml": "00 00 00 00 0 00 0 00 00 0 00 0 00 00 00 0 0 00 00 00 0 00 0 00 00 0 0 00 00 00 0 0 00 0 0 00 00 0 0 00 0 0 0 00 00 00 00 0",
    "two-scorers": "1 0 3 1 3 3 1 3 3 1 3 3 1 3 3 1 3 3 1 3 3 1 3 3 1 0 3 1 3 3 1 3 3 1 3 3 1 0 0 1 0 0 1 3 3 1 3 3",
    "bare": "0 1 2 3 2 0 3 0 0 3 0 2 0 0 0 3 2 0 1 0 2 0 2 0 0 1 2 0 0 0 1 2 0 3 2 0 0 1 1 0 1 1 1 0 0 0 0 2",
}


@pytest.mark.parametrize("name", sorted(PINNED))
async def test_seed_configs_route_as_they_did(name: str) -> None:
    docs = {"two-scorers": TWO_SCORERS, "bare": BARE}
    doc = docs[name] if name in docs else config_file(name)
    pods = PD_PODS if name.startswith("pd-") else PODS
    assert " ".join(await route_all(doc, pods)) == PINNED[name]
