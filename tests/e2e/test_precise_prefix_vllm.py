"""End to end: precise-prefix-cache-scorer on two real vLLM CPU pods.

A long prompt (several 32-token blocks) is warmed on one pod by POSTing it straight to that
pod; the pod publishes BlockStored over ZMQ; the gateway (precise-prefix-cache-scorer with the
tiny model's own tokenizer.json, blockSize 32, an in-memory index, each endpoint's `kvEvents`
pointing at its pod's publisher, queue-scorer at a low weight) indexes the blocks, and the same
prompt sent through the gateway lands on the warm pod (`x-decoder-host-port`). Each pod is
warmed in turn, for completions, for chat completions (rendered with the model's chat
template by the gateway, as vLLM does) and for Anthropic Messages API requests (converted to
chat as vLLM's /v1/messages front end does, then rendered), and each routed prompt is sent
three times, so a pass by luck has a chance of 2**-12.

Run with `python -m pytest -m e2e_vllm tests/e2e` (the pods are the session's, see conftest).
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import (
    BLOCK_SIZE,
    HEADER,
    MODEL,
    MODEL_DIR,
    GatewayProcess,
    Pod,
    gateway_process,
    http_post_json,
)

pytestmark = [pytest.mark.e2e_vllm, pytest.mark.timeout(600)]

SCORER = "precise-prefix-cache-scorer"


def precise_config(pods: list[Pod]) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {
                "type": SCORER,
                "parameters": {
                    "tokenProcessorConfig": {"blockSize": BLOCK_SIZE},
                    "indexerConfig": {
                        "tokenizersPoolConfig": {
                            "modelName": MODEL,
                            "workersCount": 1,
                            "local": {"modelTokenizerMap": {MODEL: str(MODEL_DIR)}},
                            "hf": {"enabled": False},
                        },
                        "kvBlockIndexConfig": {
                            "inMemoryConfig": {},
                            "enableMetrics": True,
                            "metricsLoggingInterval": "200ms",
                        },
                    },
                    "kvEventsConfig": {"topicFilter": "kv@"},
                },
            },
            {"type": "queue-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": SCORER, "weight": 5},
                    {"pluginRef": "queue-scorer", "weight": 1},
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
        "endpoints": [{"name": p.name, "url": p.url, "kvEvents": p.kv_events} for p in pods],
    }


@pytest.fixture(scope="module")
def precise_gateway(
    pods: list[Pod], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    with gateway_process(precise_config(pods), tmp_path_factory.mktemp("precise-gw")) as gw:
        # The ZMQ subscriptions are made when the plugin starts; give them a moment to reach
        # the publishers (slow joiner) before any warm-up event is published.
        time.sleep(1.0)
        yield gw


def stored_blocks(log: Path) -> int:
    """The index's stored_blocks counter, from the newest "KV-cache index metrics" log line."""
    latest = 0
    for line in log.read_text(errors="replace").splitlines():
        if "KV-cache index metrics" not in line:
            continue
        try:
            latest = int(json.loads(line)["stored_blocks"])
        except (ValueError, KeyError):
            continue
    return latest


def wait_for_blocks(log: Path, at_least: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while stored_blocks(log) < at_least:
        assert time.monotonic() < deadline, (
            f"the gateway's index stored {stored_blocks(log)} blocks, expected >= {at_least}:\n"
            + log.read_text(errors="replace")[-4000:]
        )
        time.sleep(0.1)


def long_text(rng: random.Random, words: int = 110) -> str:
    """Unique text: no pod has any of its blocks cached (other tests' prompts differ)."""
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(words))


def request_body(api: str, text: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 1}
    if api == "completions":
        body["prompt"] = text
    elif api == "messages":  # Anthropic's shape, content as blocks: vLLM converts it to chat
        body["system"] = [{"type": "text", "text": "You answer in one word."}]
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    else:
        body["messages"] = [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": text},
        ]
    return body


PATHS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
}


def path_of(api: str) -> str:
    return PATHS[api]


def prompt_tokens_of(api: str, reply: dict[str, Any]) -> int:
    usage = reply["usage"]
    return int(usage["input_tokens"] if api == "messages" else usage["prompt_tokens"])


@pytest.mark.parametrize("api", ["completions", "chat", "messages"])
@pytest.mark.parametrize("warm", [0, 1])
def test_prompt_warmed_on_one_pod_lands_there(
    api: str, warm: int, pods: list[Pod], precise_gateway: GatewayProcess
) -> None:
    client_rng = random.Random()
    text = long_text(client_rng)
    body = request_body(api, text)
    warm_pod = pods[warm]

    before = stored_blocks(precise_gateway.log)
    reply = http_post_json(warm_pod.url + path_of(api), body)
    prompt_tokens = prompt_tokens_of(api, reply)
    assert prompt_tokens >= 6 * BLOCK_SIZE, prompt_tokens  # several full blocks
    wait_for_blocks(precise_gateway.log, before + prompt_tokens // BLOCK_SIZE)

    for attempt in range(3):
        req = urllib.request.Request(
            precise_gateway.url + path_of(api),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            served = resp.headers[HEADER]
            routed = json.loads(resp.read())
        assert prompt_tokens_of(api, routed) == prompt_tokens
        assert served == warm_pod.host_port, (
            f"attempt {attempt}: {api} prompt warmed on {warm_pod.name} "
            f"({warm_pod.host_port}) was routed to {served}"
        )


def test_a_cache_salt_keeps_a_prompt_on_the_pod_warmed_with_that_salt(
    pods: list[Pod], precise_gateway: GatewayProcess
) -> None:
    """The same text warmed on pod 0 under a salt and on pod 1 without: vLLM keeps the two
    apart (the salt is in the first block's hash, and its events list it in extra_keys), so
    the salted prompt must go to pod 0 and the unsalted one to pod 1, each time."""
    text = long_text(random.Random())
    salted = {**request_body("completions", text), "cache_salt": "tenant-a"}
    plain = request_body("completions", text)
    before = stored_blocks(precise_gateway.log)
    prompt_tokens = http_post_json(pods[0].url + "/v1/completions", salted)["usage"][
        "prompt_tokens"
    ]
    http_post_json(pods[1].url + "/v1/completions", plain)
    wait_for_blocks(precise_gateway.log, before + 2 * (prompt_tokens // BLOCK_SIZE))
    for body, pod in ((salted, pods[0]), (plain, pods[1])) * 3:
        req = urllib.request.Request(
            precise_gateway.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            served = resp.headers[HEADER]
            resp.read()
        assert served == pod.host_port, (
            f"salt {body.get('cache_salt')!r}: routed to {served}, warmed on {pod.name}"
        )
