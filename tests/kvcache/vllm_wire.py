"""vLLM KV-event batches as vLLM puts them on the wire, in both shapes, for tests."""

from __future__ import annotations

import time
from typing import Any

import msgpack

STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
)


def stored(
    hashes: list[Any],
    tokens: list[int],
    parent: Any = None,
    block_size: int = 16,
    medium: str | None = "GPU",
    lora_name: str | None = None,
    lora_id: int | None = None,
    extra_keys: list[Any] | None = None,
) -> dict[str, Any]:
    """A BlockStored event; `extra_keys` (newer vLLM: per block, what its hash folds in
    besides the tokens) is left out when None, as vLLM omits it."""
    event = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": lora_id,
        "medium": medium,
        "lora_name": lora_name,
    }
    if extra_keys is not None:
        event["extra_keys"] = extra_keys
    return event


def removed(hashes: list[Any], medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def as_array(event: dict[str, Any]) -> list[Any]:
    """The older positional form: the class name, then the fields in declaration order."""
    tag = event["type"]
    if tag == "BlockStored":
        return [tag, *(event.get(f) for f in STORED_FIELDS)]
    if tag == "BlockRemoved":
        return [tag, event["block_hashes"], event["medium"]]
    return [tag]


def batch(events: list[dict[str, Any]], shape: str = "map", dp_rank: int | None = 0) -> bytes:
    """`shape`: "map" (events as maps, batch as [ts, events, rank]), "array" (events as tagged
    arrays) or "map-batch" (newest vLLM: the batch itself a map)."""
    evs: list[Any] = [as_array(e) for e in events] if shape == "array" else list(events)
    body: Any
    if shape == "map-batch":
        body = {"ts": time.time(), "events": evs, "data_parallel_rank": dp_rank}
    else:
        body = [time.time(), evs, dp_rank]
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


class Publisher:
    """A vLLM-style publisher under the test's control: a PUB socket, and optionally a replay
    ROUTER answering from every batch ever "published" (including ones deliberately not sent,
    to make gaps)."""

    def __init__(self, ctx: Any, replay: bool = True, topic: str = "kv@pod@m") -> None:
        import asyncio

        import zmq

        self.topic = topic.encode()
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.router = None
        self.replay_requests: list[int] = []
        self._task = None
        for _ in range(50):  # the replay socket sits on the PUB port + 1: find a free pair
            self.pub = ctx.socket(zmq.PUB)
            self.pub.setsockopt(zmq.LINGER, 0)
            self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            if not replay:
                break
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            try:
                self.router.bind(f"tcp://127.0.0.1:{self.port + 1}")
                break
            except zmq.ZMQError:
                self.router.close(0)
                self.pub.close(0)
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        if replay:
            self._task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        assert self.router is not None
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart(
                [client, b"", (-1).to_bytes(8, "big", signed=True), b""]
            )

    async def publish(self, payload: bytes, send: bool = True, seq: int | None = None) -> int:
        seq = self.seq if seq is None else seq
        self.seq = seq + 1
        self.buffer.append((seq, payload))
        if send:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def close(self) -> None:
        import contextlib

        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self.pub.close(0)
        if self.router is not None:
            self.router.close(0)


async def until_live(
    pub: Publisher, received: Any, pod: str, within: float = 5.0, empty: bytes | None = None
) -> None:
    """Publish empty batches (vLLM's, or `empty` in another wire format) until the subscriber
    has received one (ZMQ's slow joiner)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not received.get(pod):
        if loop.time() > deadline:
            raise AssertionError(f"no KV events of {pod} received")
        await pub.publish(batch([]) if empty is None else empty)
        await asyncio.sleep(0.02)


def sglang_batch(
    events: list[dict[str, Any]], current: bool = False, salt: str | None = None, rank: int = 0
) -> bytes:
    """A batch as SGLang's ZmqEventPublisher encodes it (sglang/srt/disaggregation/
    kv_events.py: msgspec array_like structs, tag=True, trailing defaults omitted).

    `current` False, the first release: `[ts, events]`, BlockStored's five fields
    (hashes, parent, tokens, block size, lora_id), BlockRemoved's hashes only. True, as SGLang
    publishes now: `[ts, events, attn_dp_rank]`, `medium` after those fields when the event
    has one, and with `salt` a stored event is BlockStoredWithMetadata: same tag, `medium`
    then a `{"cache_salt": salt}` map."""
    evs: list[Any] = []
    for event in events:
        tag = event["type"]
        medium = event.get("medium") if current else None
        if tag == "BlockStored":
            fields = [tag, *(event[f] for f in STORED_FIELDS[:5])]
            if salt is not None and current:
                fields += [medium, {"cache_salt": salt}]
            elif medium is not None:
                fields.append(medium)
            evs.append(fields)
        elif tag == "BlockRemoved":
            evs.append([tag, event["block_hashes"], *([medium] if medium else [])])
        else:
            evs.append([tag])
    body: list[Any] = [time.time(), evs, rank] if current else [time.time(), evs]
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out
