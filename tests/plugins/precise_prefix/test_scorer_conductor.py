"""precise-prefix-cache-scorer with `kvBlockIndexConfig.conductorConfig`: the same events,
sent by real ZMQ publishers to a real conductor (aiohttp test server) or applied to the
in-process index, give the same scores; LoRA namespaces; an unreachable conductor fails
open."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestClient

from heimdall_proxy.conductor.app import CONDUCTOR, create_app
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.kvcache.events import decode_batch
from heimdall_proxy.tokenization.local import LocalTokenizer
from tests.conftest import eventually
from tests.helpers import ep
from tests.kvcache.vllm_wire import Publisher, batch, stored, until_live
from tests.plugins.helpers import req
from tests.plugins.precise_prefix.test_scorer import make
from tests.tokenization.model import make_model_dir

BODY = {"prompt": "hello world the gateway routes every request to a pod it knows well"}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "tiny")


@pytest.fixture
async def conductor(aiohttp_client: Any) -> TestClient[Any, Any]:
    out: TestClient[Any, Any] = await aiohttp_client(create_app())
    return out


async def register(conductor: TestClient[Any, Any], pub: Publisher, pod: str, model: str) -> None:
    body = {"endpoint": pub.endpoint, "type": "vLLM", "modelname": model, "instance_id": pod,
            "block_size": 4, "dp_rank": 0}  # fmt: skip
    resp = await conductor.post("/register", json=body)
    assert resp.status == 200
    await until_live(pub, conductor.app[CONDUCTOR].subscriber.received, f"{pod}|default|0")


async def test_the_same_events_score_the_same_through_a_conductor(
    model_dir: Path, conductor: TestClient[Any, Any], ctx: zmq.asyncio.Context
) -> None:
    model = str(model_dir)
    tokens = LocalTokenizer(model_dir / "tokenizer.json").tokenize_request("completions", BODY)
    n = len(tokens) // 4
    events = {
        "a": [stored(list(range(n)), tokens[: n * 4], block_size=4)],
        "b": [stored([100, 101], tokens[:8], block_size=4)],
        "l": [stored([7, 8, 9], tokens[:12], block_size=4, lora_name="ad")],
        # a request's cache_salt, as newer vLLM reports it in the first block's extra keys
        "s": [
            stored([20, 21], tokens[:8], block_size=4, extra_keys=[["x"], None]),
            stored([22], tokens[8:12], parent=21, block_size=4),
        ],
    }
    local = make(model)
    local.ingest.ready = True  # not started: fed directly below
    for pod, evs in events.items():
        await local.ingest.apply(pod, decode_batch(batch(evs)))
    remote = make(model, indexer={"kvBlockIndexConfig": {"conductorConfig": {
        "url": str(conductor.make_url("")), "timeout": "2s"}}})  # fmt: skip
    assert remote.index is None and remote.ingest is None
    pubs = {pod: Publisher(ctx, replay=False) for pod in events}
    try:
        for pod, pub in pubs.items():
            await register(conductor, pub, pod, model)
            await pub.publish(batch(events[pod]))
        await eventually(lambda: conductor.app[CONDUCTOR].events.stored == 5)
        await remote.start()
        lora_pod = ep("l")
        lora_pod.model_cards = {model: {"id": model, "parent": None},
                                "ad": {"id": "ad", "parent": model}}  # fmt: skip
        pods = [ep("a"), ep("b"), ep("c"), lora_pod, ep("s")]
        for requested, salt, expected in (
            (model, None, {"a": 1.0, "b": 2 / n, "c": 0.0, "l": 0.0, "s": 0.0}),
            ("ad", None, {"a": 0.0, "b": 0.0, "c": 0.0, "l": 3 / n, "s": 0.0}),
            (model, "x", {"a": 0.0, "b": 0.0, "c": 0.0, "l": 0.0, "s": 3 / n}),
        ):
            scores = []
            for scorer in (local, remote):
                state = CycleState()
                body = BODY if salt is None else {**BODY, "cache_salt": salt}
                r = req("completions", body, model=requested)
                await scorer.produce(state, r, pods)
                scores.append(scorer.score(state, r, pods))
            assert scores[0] == pytest.approx(expected)
            assert scores[1] == pytest.approx(expected)
        assert remote.stats.lookups == 3 and remote.stats.lookup_hits == 3
    finally:
        await remote.stop()
        for pub in pubs.values():
            await pub.close()


async def test_an_unreachable_conductor_scores_zero(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        scorer = make(str(model_dir), speculativeIndexing=True, indexer={
            "kvBlockIndexConfig": {"conductorConfig": {"url": "http://127.0.0.1:9"}}})  # fmt: skip
    assert "speculativeIndexing" in caplog.text and "not honoured" in caplog.text
    await scorer.start()
    try:
        state = CycleState()
        r = req("completions", BODY, model=str(model_dir))
        await scorer.produce(state, r, [ep("a")])
        assert scorer.score(state, r, [ep("a")]) == {"a": 0.0}
        assert "index lookup failed" in caplog.text
    finally:
        await scorer.stop()


def test_an_answer_becomes_the_tier_weighted_run() -> None:
    from heimdall_proxy.kvcache.index.conductor import ConductorClient

    client = ConductorClient("http://x", 4, "m", 1337)
    # GPU holds 2 blocks from the start, CPU 5, disk 6: 2 x 1.0 + 3 x 0.8 + 1 x 0.5
    hit = {"longest_matched": 24, "GPU": 8, "CPU": 20, "DISK": 24}
    assert client._weighted(hit) == pytest.approx(4.9)
    # a run that leaves the GPU for a medium the answer cannot place counts at the CPU's
    assert client._weighted({"longest_matched": 12, "GPU": 8}) == pytest.approx(2.8)
    assert client._weighted({"longest_matched": 0}) == 0.0
