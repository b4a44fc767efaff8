"""KV-cache events in vLLM's wire format, published on a ZMQ PUB socket with a ROUTER socket
for replay, as vLLM's ZmqEventPublisher does.

Every message is three frames: the topic, the sequence number as 8 bytes big-endian, and a
msgpack payload: the batch `[ts, [events...], data_parallel_rank]`. An event is, in the
newer "map" form, a map tagged by `"type"`:
`{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
"lora_id", "medium", "lora_name", "extra_keys"}` (extra_keys only when a block has some),
`{"type": "BlockRemoved", "block_hashes", "medium"}`,
`{"type": "AllBlocksCleared"}`; in the older "array" form the same fields positionally, the
class name first. Replay: a client sends `[b"", start_seq (8 bytes)]` to the ROUTER; every
buffered batch from that sequence on comes back as `[b"", seq, payload]`, then
`[b"", seq -1, b""]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from heimdall_proxy.sim.options import KVEventsFormat, KVHashFormat

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
GPU = "GPU"
CPU = "CPU"


@dataclass(slots=True, frozen=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str
    lora_name: str | None
    #: Per block, what vLLM folded into its hash besides the tokens (LoRA name, cache_salt
    #: on a prompt's first block); None (not sent) when no block has any.
    extra_keys: list[tuple[str, ...] | None] | None = None


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str


@dataclass(slots=True, frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def _hash(value: int | None, fmt: KVHashFormat) -> int | bytes | None:
    if value is None or fmt == "int":
        return value
    # vLLM with a sha256 hash function exposes 32-byte digests.
    return hashlib.sha256(value.to_bytes(8, "big")).digest()


def encode_event(event: KVEvent, fmt: KVEventsFormat, hash_fmt: KVHashFormat) -> Any:
    if isinstance(event, BlockStored):
        fields: dict[str, Any] = {
            "block_hashes": [_hash(h, hash_fmt) for h in event.block_hashes],
            "parent_block_hash": _hash(event.parent_block_hash, hash_fmt),
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": event.lora_name,
        }
        if event.extra_keys is not None:
            fields["extra_keys"] = [None if k is None else list(k) for k in event.extra_keys]
    elif isinstance(event, BlockRemoved):
        fields = {
            "block_hashes": [_hash(h, hash_fmt) for h in event.block_hashes],
            "medium": event.medium,
        }
    else:
        fields = {}
    tag = type(event).__name__
    if fmt == "array":
        return [tag, *fields.values()]
    return {"type": tag, **fields}


def encode_batch(
    events: list[KVEvent],
    fmt: KVEventsFormat = "map",
    hash_fmt: KVHashFormat = "int",
    ts: float | None = None,
    dp_rank: int = 0,
) -> bytes:
    batch = [
        time.time() if ts is None else ts,
        [encode_event(e, fmt, hash_fmt) for e in events],
        dp_rank,
    ]
    out: bytes = msgpack.packb(batch, use_bin_type=True)
    return out


class KVEventPublisher:
    """PUB socket plus replay ROUTER socket of one pod. `publish` never blocks (a PUB socket
    drops at its high-water mark, as vLLM's does)."""

    def __init__(
        self,
        host: str,
        port: int,
        replay_port: int | None,
        topic: str,
        fmt: KVEventsFormat = "map",
        hash_fmt: KVHashFormat = "int",
        buffer_steps: int = 10_000,
    ) -> None:
        self.fmt: KVEventsFormat = fmt
        self.hash_fmt: KVHashFormat = hash_fmt
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        # The PUB socket is a plain one: a non-blocking send either goes out or raises
        # zmq.Again at once. Only the replay ROUTER needs to wait, so it is an asyncio one.
        self._pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            self.port = self._bind(self._pub, host, port)
            if replay_port is None:
                replay_port = -1 if port < 0 else self.port + 1
            if replay_port:
                self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self.replay_port: int | None = self._bind(self._replay, host, replay_port)
            else:
                self.replay_port = None
        except zmq.ZMQError:
            self.close_sockets()
            raise
        self.endpoint = f"tcp://{host}:{self.port}"
        self.replay_endpoint = (
            f"tcp://{host}:{self.replay_port}" if self.replay_port is not None else None
        )

    @staticmethod
    def _bind(sock: zmq.Socket[Any], host: str, port: int) -> int:
        bind_host = "*" if host in ("", "0.0.0.0") else host
        if port < 0:
            return int(sock.bind_to_random_port(f"tcp://{bind_host}"))
        sock.bind(f"tcp://{bind_host}:{port}")
        return port

    def set_topic(self, topic: str) -> None:
        """Publish under `topic` from now on: a topic naming the publisher's own address is
        only known once its random port is bound (sim.kvfleet)."""
        self._topic = topic.encode()

    def start(self) -> None:
        if self._replay is not None and self._task is None:
            self._task = asyncio.create_task(self._serve_replay(), name="sim-kv-replay")

    def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        payload = encode_batch(events, self.fmt, self.hash_fmt)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid KV events replay request: %d frames", len(frames))
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await sock.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            await sock.send_multipart((client, b"", END_SEQ, b""))

    def close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.close_sockets()
