"""Simulated pods on real sockets, plus helpers to talk to them: SSE parsing, TTFT, metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from heimdall_proxy.sim import SimOptions, SimPod


@dataclass
class Sim:
    pod: SimPod
    server: TestServer
    http: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.http.post(f"{self.url}{path}", json=body) as r:
            return r.status, await r.json()

    async def stream(self, path: str, body: dict[str, Any]) -> Streamed:
        """POST with stream=true; the SSE events, and the time to the first text."""
        t0 = time.perf_counter()
        out = Streamed()
        async with self.http.post(f"{self.url}{path}", json={**body, "stream": True}) as r:
            assert r.status == 200, await r.text()
            assert r.headers["Content-Type"].startswith("text/event-stream")
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    out.add(raw, time.perf_counter() - t0)
        out.e2e = time.perf_counter() - t0
        return out

    async def metrics(self) -> Metrics:
        async with self.http.get(f"{self.url}/metrics") as r:
            assert r.status == 200
            return Metrics(await r.text())


class Streamed:
    def __init__(self) -> None:
        self.events: list[tuple[str | None, Any]] = []  # (event name, data)
        self.times: list[float] = []  # when each event arrived (time.perf_counter())
        self.ttft: float | None = None
        self.e2e = 0.0

    def add(self, raw: bytes, at: float) -> None:
        name = None
        data: Any = None
        for line in raw.decode().split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                payload = line[len("data: ") :]
                data = payload if payload == "[DONE]" else orjson.loads(payload)
        self.events.append((name, data))
        self.times.append(time.perf_counter())
        if self.ttft is None and _has_text(data):
            self.ttft = at

    @property
    def data(self) -> list[Any]:
        return [d for _, d in self.events]


def _has_text(doc: Any) -> bool:
    if not isinstance(doc, dict):
        return False
    if doc.get("type") == "response.output_text.delta":
        return True
    for choice in doc.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


class Metrics:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [
            (s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        found = [v for n, lab, v in self.samples if n == name and labels.items() <= lab.items()]
        assert found, f"no sample {name} {labels}"
        return sum(found)

    def labels(self, name: str) -> list[dict[str, str]]:
        return [lab for n, lab, _ in self.samples if n == name]


SimFactory = Callable[..., Awaitable[Sim]]


@pytest.fixture
async def sim(aiohttp_server: Any) -> AsyncIterator[SimFactory]:
    """Start a pod: `await sim(max_num_seqs=2, ...)`; time_scale defaults to 0.01."""
    async with aiohttp.ClientSession() as http:

        async def go(**options: Any) -> Sim:
            options.setdefault("time_scale", 0.01)
            pod = SimPod(SimOptions(**options))
            server = await aiohttp_server(pod.app())
            return Sim(pod, server, http)

        yield go


@pytest.fixture
def zmq_ctx() -> zmq.asyncio.Context:
    return zmq.asyncio.Context.instance()


async def subscribe(ctx: zmq.asyncio.Context, endpoint: str, topic: bytes = b"") -> Any:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    # ZMQ's slow joiner: a PUB drops what it sends before the subscription reached it;
    # half a second covers a busy 2-core machine
    await asyncio.sleep(0.5)
    return sub


async def recv_batches(sub: Any, until: Callable[[list[Any]], bool], within: float = 3.0) -> Any:
    """Receive (topic, seq, batch) messages until `until(events so far)` holds."""
    import msgpack

    got: list[tuple[bytes, int, Any]] = []
    events: list[Any] = []
    deadline = asyncio.get_running_loop().time() + within
    while not until(events):
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise AssertionError(f"events not seen in time; got {events}")
        topic, seq, payload = await asyncio.wait_for(sub.recv_multipart(), left)
        batch = msgpack.unpackb(payload)
        got.append((topic, int.from_bytes(seq, "big"), batch))
        events.extend(batch[1])
    return got, events


def prompt_of(n_words: int, salt: str = "w") -> str:
    """A completions prompt of exactly n tokens plus BOS: n words of at most 4 characters."""
    return " ".join(f"{salt[:1]}{i:03x}" for i in range(n_words))
