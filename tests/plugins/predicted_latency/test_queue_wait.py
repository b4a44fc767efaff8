"""The TTFT prediction adds the in-flight ledger's learned queue wait to the model's part and
trains the model on what follows that wait: a pod whose slots are full waits for them, which
a model linear in the in-flight counts underestimates (bench/RESULTS.md, "The latency model
diverged")."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from heimdall_proxy.config.build import instantiate
from heimdall_proxy.config.gateway import PluginConfig
from heimdall_proxy.framework.queue_price import QueuePrice
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.predicted_latency.model import OnlineLatencyModel
from heimdall_proxy.plugins.predicted_latency.producer import PredictedLatencyProducer
from heimdall_proxy.plugins.predicted_latency.state import read_predictions
from tests.helpers import ep
from tests.plugins.helpers import ctx, ledger, req


def test_the_model_learns_what_follows_a_foreseen_wait() -> None:
    """TTFT = a wait the model is told + a linear part: the model learns the linear part
    exactly, however large and random the waits (unrelated to its features)."""
    rng = random.Random(3)
    model = OnlineLatencyModel(1, min_samples=8)
    for _ in range(2000):
        x = rng.uniform(0.0, 2.0)
        wait = rng.uniform(0.0, 5.0)
        model.observe("a", [x], wait + 0.2 + 0.1 * x, wait)
    got = model.predict(["a", "a"], np.asarray([[0.0], [2.0]]))
    assert np.allclose(got, [0.2, 0.4], rtol=0.05)
    assert abs(model.factors["a"] - 1.0) < 0.05


def _producer(**params: Any) -> PredictedLatencyProducer:
    plugin = instantiate(
        load_builtin_plugins(),
        PluginConfig(type="predicted-latency-producer", parameters={"minSamples": 1, **params}),
        ledger(),
    )
    assert isinstance(plugin, PredictedLatencyProducer)
    for _ in range(8):  # every row alike: the model predicts its intercept, 0.5 s
        plugin.predictor.ttft.observe("idle", [0.0] * 8, 0.5)
    plugin.predictor.ttft.flush()
    return plugin


async def test_a_pods_queue_wait_is_added_to_its_ttft_and_not_learned_by_the_model() -> None:
    # at 1,000 tokens/s and nothing learned yet, the ledger prices 3,000 prompt tokens in
    # flight at 3 s of wait
    producer = _producer(peakPrefillThroughput=1000.0)
    producer.load.acquire("earlier:0", "busy", prompt=3000, whole=3000)
    pods = [ep("busy"), ep("idle")]
    state = CycleState()
    producer.predict(state, req(), pods)
    preds = read_predictions(state)
    assert preds is not None and preds.waits == {"busy": 3.0}
    busy, idle = preds.pods["busy"].ttft, preds.pods["idle"].ttft
    assert idle == 0.5 and abs(busy - idle - 3.0) < 0.05

    # the request goes to the busy pod and answers after its wait and 0.5 s more: the model
    # learns 0.5 s there, not 3.5 s
    c = ctx(req(), pods[0])
    c.state = state
    producer.load.acquire(c.key, "busy", prompt=10, whole=10)
    await producer.pre_request(c)
    c.first_chunk_at = c.last_chunk_at = c.started_at + 3.5
    c.status = 200
    await producer.response_complete(c)
    producer.predictor.ttft.flush()
    model = producer.predictor.ttft
    row = preds.features_of("busy")
    assert row is not None
    assert abs(float(model.base(np.asarray([row]))[0]) * model.factors["busy"] - 0.5) < 0.05


def test_idle_pods_are_not_priced_and_queue_wait_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = _producer()
    assert producer.queue_price is not None
    asked: list[str] = []
    wait = QueuePrice.wait

    def counted(self: QueuePrice, pod: str, *args: Any, **kwargs: Any) -> float:
        asked.append(pod)
        return wait(self, pod, *args, **kwargs)

    monkeypatch.setattr(QueuePrice, "wait", counted)
    producer.load.acquire("k:0", "pod-3", prompt=100, whole=100)
    producer.predict(CycleState(), req(), [ep(f"pod-{i}") for i in range(64)])
    assert asked == ["pod-3"]  # one lookup per pod with requests in flight, none per idle pod

    off = _producer(queueWait=False)
    assert off.queue_price is None
    off.load.acquire("k:0", "pod-3", prompt=100_000, whole=100_000)
    state = CycleState()
    off.predict(state, req(), [ep("pod-3"), ep("pod-4")])
    preds = read_predictions(state)
    assert preds is not None and preds.waits == {}


async def test_a_late_request_is_late_against_the_prediction_it_was_sent_with() -> None:
    producer = _producer(peakPrefillThroughput=1000.0)
    producer.load.acquire("earlier:0", "busy", prompt=3000, whole=3000)  # 3 s of wait
    pods = [ep("busy"), ep("idle")]
    model = producer.predictor.ttft

    async def sent(remote: bool) -> float:
        state = CycleState()
        producer.predict(state, req(), pods)
        preds = read_predictions(state)
        assert preds is not None
        if remote:  # a prediction server's whole TTFT, 1 s, to which no wait is added
            preds.waits_added = False
            preds.pods.ttft[preds.pods.index["busy"]] = 1.0
        c = ctx(req(), pods[0])
        c.state = state
        producer.load.acquire(c.key, "busy", prompt=10, whole=10)
        await producer.pre_request(c)
        return c.started_at

    # in-process: 3 s of wait then 0.5 s; 2.5 s after the send it is not late yet
    started = await sent(remote=False)
    producer._censored(started + 2.5)
    assert model.factors.get("busy", 1.0) == 1.0
    producer._censored(started + 4.5)  # 1.5 s after its wait, three times the 0.5 s
    assert model.factors["busy"] == pytest.approx(3.0, rel=0.05)
    model.clear_floor("busy")
    producer._pending.clear()

    # remote: 1 s for everything; 2.5 s after the send it is late by 2.5x, wait or no wait
    started = await sent(remote=True)
    producer._censored(started + 2.5)
    assert model.factors["busy"] == pytest.approx(2.5, rel=0.05)
