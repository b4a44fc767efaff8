"""Capture test fixtures from a real vLLM pod: one /metrics text under load and KV-event batches.

Start one pod whose KV cache is small enough to evict and whose batch is small enough to queue,
so the captures hold non-zero running/waiting counts, KV usage and BlockRemoved events:

    bash bench/real_vllm/start_pods.sh 1 18300 -- \
        --max-num-seqs 2 --num-gpu-blocks-override 64 --max-model-len 1024
    python -m bench.real_vllm.capture_fixtures --pod http://127.0.0.1:18300 \
        --kv tcp://127.0.0.1:19300
    bash bench/real_vllm/stop_pods.sh

Runs with the gateway's venv (pyzmq and msgpack are gateway dependencies). Writes:

- tests/datalayer/fixtures/vllm_metrics_real.txt: /metrics while requests run and queue
- tests/fixtures/vllm_kv_events_real.bin: the payload frame of the first batch holding a
  BlockStored event, byte for byte as received
- tests/fixtures/vllm_kv_events_real_removed.bin: the same for the first batch holding a
  BlockRemoved event
- tests/fixtures/vllm_kv_events_real_stream.msgpack: every message received, in order, as a
  msgpack array of [topic, seq, payload] (three bin values: the three ZMQ frames unchanged)
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgpack
import zmq

REPO = Path(__file__).resolve().parents[2]
PROMPT_WORDS = "the router picks a pod for every request and the pod keeps its prefix cache"


def post(url: str, body: dict[str, object]) -> None:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def event_types(payload: bytes) -> set[str]:
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    types = set()
    for event in batch[1]:
        types.add(event["type"] if isinstance(event, dict) else event[0])
    return types


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pod", default="http://127.0.0.1:18300")
    parser.add_argument("--kv", default="tcp://127.0.0.1:19300")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--requests", type=int, default=4, help="concurrent requests")
    parser.add_argument("--max-tokens", type=int, default=300)
    args = parser.parse_args(argv)

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(args.kv)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    time.sleep(0.5)  # ZMQ slow joiner: let the subscription reach the publisher

    # Distinct prompts, each several blocks long, so that with a 64-block cache the later
    # requests evict the earlier ones' cached blocks.
    words = PROMPT_WORDS.split()
    threads = []
    for i in range(args.requests):
        prompt = " ".join(f"{words[(i + j) % len(words)]}{i}" for j in range(120))
        body = {
            "model": args.model,
            "prompt": prompt,
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
        }
        t = threading.Thread(target=post, args=(f"{args.pod}/v1/completions", body))
        t.start()
        threads.append(t)

    metrics_text = None
    deadline = time.monotonic() + 120
    while metrics_text is None and time.monotonic() < deadline:
        with urllib.request.urlopen(f"{args.pod}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        if metric(text, "vllm:num_requests_running") > 0 and (
            metric(text, "vllm:num_requests_waiting") > 0
        ):
            metrics_text = text
        else:
            time.sleep(0.05)
    for t in threads:
        t.join()
    if metrics_text is None:
        print("never saw running and waiting requests at once", file=sys.stderr)
        return 1

    messages: list[list[bytes]] = []
    sub.RCVTIMEO = 2000
    try:
        while True:
            messages.append(sub.recv_multipart())
    except zmq.Again:
        pass
    stored = next((m for m in messages if "BlockStored" in event_types(m[2])), None)
    removed = next((m for m in messages if "BlockRemoved" in event_types(m[2])), None)
    if stored is None:
        print(f"no BlockStored among {len(messages)} messages", file=sys.stderr)
        return 1

    metrics_path = REPO / "tests/datalayer/fixtures/vllm_metrics_real.txt"
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(metrics_text)
    fixtures = REPO / "tests/fixtures"
    fixtures.mkdir(parents=True, exist_ok=True)
    (fixtures / "vllm_kv_events_real.bin").write_bytes(stored[2])
    if removed is not None:
        (fixtures / "vllm_kv_events_real_removed.bin").write_bytes(removed[2])
    (fixtures / "vllm_kv_events_real_stream.msgpack").write_bytes(
        msgpack.packb([list(m) for m in messages], use_bin_type=True)
    )
    print(
        f"metrics: running {metric(metrics_text, 'vllm:num_requests_running'):g}, "
        f"waiting {metric(metrics_text, 'vllm:num_requests_waiting'):g}; "
        f"{len(messages)} KV-event messages, BlockRemoved {'yes' if removed else 'no'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
