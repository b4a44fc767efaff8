"""End to end against real vLLM: two vLLM CPU pods serving a tiny model, the gateway in front.

Deselected by default (pyproject's addopts); run with

    bash bench/real_vllm/setup.sh && python -m pytest -m e2e_vllm tests/e2e

The pods are started once per session with bench/real_vllm/start_pods.sh (about a minute on
two cores) and stopped at the end; the gateway runs as a subprocess exactly as a user starts it,
with queue-scorer + kv-cache-utilization-scorer and --response-header. Every test is skipped,
with the reason, when the vLLM venv or the model is missing.
"""

from __future__ import annotations

import random
import time
import urllib.error
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from heimdall_proxy.config.gateway import parse_config
from tests.conftest import GatewayFactory
from tests.e2e.conftest import (
    BLOCK_SIZE,
    HEADER,
    MODEL,
    GatewayProcess,
    Pod,
    gateway_config,
    http_get,
    http_post_json,
)

# Pod start-up runs inside the first test's timeout: allow for it on a busy machine.
pytestmark = [pytest.mark.e2e_vllm, pytest.mark.timeout(600)]


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[Any]:
    from openai import OpenAI

    with OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


# The model has random weights: what it says is noise. ignore_eos keeps the length exact.
PROMPT = "The router picks a pod for every request"
LENGTH = {"max_tokens": 8, "extra_body": {"ignore_eos": True}}


def test_models_lists_the_pods_model(client: Any) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completions(client: Any, pods: list[Pod]) -> None:
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, **LENGTH)
    assert raw.headers[HEADER] in {p.host_port for p in pods}
    reply = raw.parse()
    assert reply.model == MODEL
    assert isinstance(reply.choices[0].text, str)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 8
    assert reply.usage.prompt_tokens > 1


def test_completions_stream(client: Any) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            stream=True,
            stream_options={"include_usage": True},
            **LENGTH,
        )
    )
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    # vLLM may coalesce a fast generation's tokens into one event: at least one event with
    # the text, then the usage event the client asked for
    assert sum(1 for c in chunks if c.choices) >= 1 and len(chunks) >= 2
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert [f for f in finishes if f] == ["length"]
    assert chunks[-1].usage.completion_tokens == 8


def test_chat(client: Any, pods: list[Pod]) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Which pod?"},
        ],
        **LENGTH,
    )
    assert raw.headers[HEADER] in {p.host_port for p in pods}
    reply = raw.parse()
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 8


def test_chat_stream(client: Any) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Which pod?"}],
            stream=True,
            stream_options={"include_usage": True},
            **LENGTH,
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert sum(1 for d in deltas if d.content) >= 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_responses(client: Any, pods: list[Pod]) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Which pod?", max_output_tokens=8
    )
    assert raw.headers[HEADER] in {p.host_port for p in pods}
    reply = raw.parse()
    assert reply.object == "response"
    assert reply.output[0].type == "message"
    assert isinstance(reply.output_text, str)
    assert 0 < reply.usage.output_tokens <= 8


def test_responses_stream(client: Any) -> None:
    events = list(
        client.responses.create(model=MODEL, input="Which pod?", max_output_tokens=8, stream=True)
    )
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert "response.output_text.delta" in types
    assert types[-1] in ("response.completed", "response.incomplete")
    assert 0 < events[-1].response.usage.output_tokens <= 8


def test_requests_reach_both_pods(client: Any, pods: list[Pod]) -> None:
    """Idle pods tie on both scorers and max-score-picker breaks ties at random; a request in
    flight raises its pod's KV usage. Either way both pods serve some of 16 requests (the
    chance that one pod gets all of them at random is 2**-15)."""
    served = set()
    for i in range(16):
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=f"{PROMPT} {i}", max_tokens=2
        )
        served.add(raw.headers[HEADER])
    assert served == {p.host_port for p in pods}


def _gateway_samples(gateway: GatewayProcess) -> list[Any]:
    status, body = http_get(f"{gateway.url}/metrics")
    assert status == 200
    return [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]


def test_gateway_metrics_show_both_pods_from_real_vllm_metrics(
    client: Any, gateway: GatewayProcess, pods: list[Pod]
) -> None:
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    samples = _gateway_samples(gateway)

    def per_pod(name: str) -> dict[str, float]:
        return {s.labels["model_server_pod"]: s.value for s in samples if s.name == name}

    names = {p.name for p in pods}
    assert per_pod("inference_pool_per_pod_healthy") == dict.fromkeys(names, 1.0)
    for gauge in (
        "inference_pool_per_pod_queue_size",
        "inference_pool_per_pod_running_requests",
        "inference_pool_per_pod_kv_cache_utilization",
    ):
        values = per_pod(gauge)
        assert set(values) == names, gauge
        assert all(v >= 0 for v in values.values()), gauge
    assert all(
        0.0 <= v <= 1.0 for v in per_pod("inference_pool_per_pod_kv_cache_utilization").values()
    )
    ready = [s.value for s in samples if s.name == "inference_pool_ready_pods"]
    assert ready == [2.0]
    served = {
        s.labels["pod"]
        for s in samples
        if s.name == "inference_objective_request_total" and s.labels.get("code") == "200"
    }
    assert served <= names
    assert served


async def test_gateway_pool_reads_cache_config_from_real_pods(
    pods: list[Pod], start_gateway: GatewayFactory
) -> None:
    """The gateway's own data layer, in-process, on the pods' real /metrics: the pool's
    endpoints carry vllm:cache_config_info's block_size and num_gpu_blocks (the gateway's
    /metrics does not export them). The family is scraped because a plugin that reads it
    (prefix-cache-scorer, which sizes its index from it) is configured."""
    config = {
        **gateway_config(pods),
        "plugins": [{"type": "prefix-cache-scorer"}, {"type": "max-score-picker"}],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "prefix-cache-scorer"},
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
    }
    gw = await start_gateway(parse_config(config, "<e2e>"), metrics_interval=0.1)
    for pod in pods:
        endpoint = gw.gateway.pool.get(pod.name)
        assert endpoint is not None
        assert endpoint.healthy
        assert endpoint.models is not None and MODEL in endpoint.models
        assert endpoint.metrics.updated_at > 0
        assert endpoint.metrics.block_size == BLOCK_SIZE
        assert endpoint.metrics.num_gpu_blocks is not None
        assert endpoint.metrics.num_gpu_blocks > 0


def test_kv_events_come_from_the_pod_that_served(client: Any, pods: list[Pod]) -> None:
    """A prompt of several blocks, routed by the gateway, is stored by the pod the response
    header names, and that pod alone publishes BlockStored for it."""
    ctx = zmq.Context()
    subs = []
    try:
        poller = zmq.Poller()
        for pod in pods:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.connect(pod.kv_events)
            sub.setsockopt(zmq.SUBSCRIBE, pod.topic.encode())
            poller.register(sub, zmq.POLLIN)
            subs.append(sub)
        time.sleep(0.5)  # ZMQ slow joiner: let the subscriptions reach the publishers
        prompt = " ".join(f"unique{random.randrange(10**9)}" for _ in range(40))
        raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=1)
        served = next(p for p in pods if p.host_port == raw.headers[HEADER])
        prompt_tokens = raw.parse().usage.prompt_tokens
        assert prompt_tokens >= 2 * BLOCK_SIZE

        stored: dict[str, list[dict[str, Any]]] = {p.topic: [] for p in pods}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if stored[served.topic]:
                # Got the first batch; give a split batch or a stray event elsewhere a moment.
                deadline = min(deadline, time.monotonic() + 0.5)
            for sock, _ in poller.poll(timeout=200):
                topic, seq, payload = sock.recv_multipart()
                assert len(seq) == 8
                _ts, events, _rank = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                stored[topic.decode()] += [e for e in events if e["type"] == "BlockStored"]
        events = stored[served.topic]
        assert events, f"no BlockStored from {served.name}"
        blocks = sum(len(e["block_hashes"]) for e in events)
        assert blocks == prompt_tokens // BLOCK_SIZE
        for e in events:
            assert e["block_size"] == BLOCK_SIZE
            assert len(e["token_ids"]) == BLOCK_SIZE * len(e["block_hashes"])
        others = [p for p in pods if p is not served]
        assert all(not stored[p.topic] for p in others)
    finally:
        for sub in subs:
            sub.close()
        ctx.term()


def test_transfer_params_in_vllm_xargs_never_reach_a_pod_nor_eject_one(
    client: Any, gateway: GatewayProcess, pods: list[Pod]
) -> None:
    """vLLM copies vllm_xargs.kv_transfer_params into the slot the gateway keeps for its own
    hops, and fails on a value it cannot use: the gateway drops it, so the request is served
    and no pod is charged for it."""
    poison = {"vllm_xargs": {"kv_transfer_params": "evil"}}
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, **poison}
    with pytest.raises(urllib.error.HTTPError) as direct:  # the pod alone fails on it
        http_post_json(f"{pods[0].url}/v1/completions", body)
    assert direct.value.code >= 500
    direct.value.close()
    for _ in range(4):
        reply = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=2, extra_body=poison
        )
        assert reply.choices
    ejected = [
        s for s in _gateway_samples(gateway) if s.name == "inference_objective_pod_ejections_total"
    ]
    assert all(s.value == 0 for s in ejected)
