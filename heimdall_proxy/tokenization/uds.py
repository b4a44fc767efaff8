"""A tokenizer service over a Unix domain socket (or TCP): protocol, client and server.

Protocol. Each message is a frame: a 4-byte big-endian length, then that many bytes of
msgpack. The client sends requests and the server answers each with a response carrying the
same `id`; requests on one connection may be pipelined and are answered in any order.

    request  = {"id": int, "op": "tokenize", "model": str, "api": str, "body": map}
             | {"id": int, "op": "encode", "model": str, "text": str,
                "add_special_tokens": bool}
             | {"id": int, "op": "ping"}
    response = {"id": int, "token_ids": [int, ...]}          (tokenize, encode)
             | {"id": int, "ok": true}                        (ping)
             | {"id": int, "error": str}

`tokenize` renders and tokenizes an OpenAI request body exactly as the in-process tokenizer
does (`api`: completions | chat | responses | other); `encode` tokenizes raw text. `model`
selects one of the server's tokenizers; a server with one tokenizer uses it whatever the name.
Frames over 64 MiB are refused (the connection is closed).

`heimdall-proxy tokenizer-server --socket PATH --model DIR` runs the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import struct
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import msgpack

from heimdall_proxy.tokenization.local import LocalTokenizer

log = logging.getLogger(__name__)

MAX_FRAME = 64 * 1024 * 1024
_LEN = struct.Struct(">I")


class TokenizerServiceError(RuntimeError):
    """The tokenizer service answered with an error, or could not be reached."""


def encode_frame(message: Mapping[str, Any]) -> bytes:
    payload: bytes = msgpack.packb(message, use_bin_type=True)
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return _LEN.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    """One message; raises asyncio.IncompleteReadError at end of stream."""
    (size,) = _LEN.unpack(await reader.readexactly(4))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    message = msgpack.unpackb(await reader.readexactly(size), raw=False)
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a msgpack map")
    return message


def _split_tcp(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a TCP tokenizer address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


class UDSTokenizerClient:
    """Client of the tokenizer service: one connection, opened on first use and reopened after
    a failure, with pipelined requests matched to answers by id."""

    def __init__(
        self, address: str, model: str, use_tcp: bool = False, timeout: float = 5.0
    ) -> None:
        self.address = address
        self.model = model
        self.use_tcp = use_tcp
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connect(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            if self.use_tcp:
                host, port = _split_tcp(self.address)
                reader, writer = await asyncio.open_connection(host, port)
            else:
                reader, writer = await asyncio.open_unix_connection(self.address)
            self._writer = writer
            self._reader_task = asyncio.create_task(self._read_loop(reader, writer))
            return writer

    async def _read_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        error: BaseException = TokenizerServiceError("the tokenizer service closed the connection")
        try:
            while True:
                message = await read_frame(reader)
                fut = self._pending.pop(message.get("id", -1), None)
                if fut is not None and not fut.done():
                    fut.set_result(message)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, OSError) as exc:
            if not isinstance(exc, asyncio.IncompleteReadError):
                error = TokenizerServiceError(f"tokenizer service connection failed: {exc}")
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
            self._pending.clear()

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its answer; raises TokenizerServiceError."""
        try:
            writer = await asyncio.wait_for(self._connect(), self.timeout)
        except (OSError, TimeoutError) as exc:
            raise TokenizerServiceError(
                f"cannot reach the tokenizer service at {self.address}: {exc}"
            ) from exc
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            writer.write(encode_frame({**request, "id": rid}))
            answer = await asyncio.wait_for(fut, self.timeout)
        except TimeoutError as exc:
            raise TokenizerServiceError(
                f"the tokenizer service did not answer within {self.timeout:g}s"
            ) from exc
        finally:
            self._pending.pop(rid, None)
        if "error" in answer:
            raise TokenizerServiceError(str(answer["error"]))
        return answer

    async def tokenize(self, api: str, data: Mapping[str, Any], size_hint: int = 0) -> list[int]:
        answer = await self.call({"op": "tokenize", "model": self.model, "api": api, "body": data})
        ids = answer.get("token_ids")
        if not isinstance(ids, list):
            raise TokenizerServiceError("the tokenizer service answered without token_ids")
        return ids

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        answer = await self.call(
            {
                "op": "encode",
                "model": self.model,
                "text": text,
                "add_special_tokens": add_special_tokens,
            }
        )
        ids = answer.get("token_ids")
        if not isinstance(ids, list):
            raise TokenizerServiceError("the tokenizer service answered without token_ids")
        return ids

    async def close(self) -> None:
        writer, task = self._writer, self._reader_task
        self._writer = self._reader_task = None
        if writer is not None:
            writer.close()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _prepare_socket_path(address: str) -> None:
    """Create the socket's directory; remove a stale socket left by a previous server."""
    path = Path(address)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_socket():
        path.unlink()


class ServedTokenizer(Protocol):
    """What the server needs of a tokenizer (LocalTokenizer, or the simulator's)."""

    def tokenize_request(self, api: str, data: Mapping[str, Any]) -> list[int]: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


class TokenizerServer:
    """Serves tokenizers by model name on a Unix socket (or TCP host:port)."""

    def __init__(self, tokenizers: Mapping[str, ServedTokenizer], workers: int = 4) -> None:
        if not tokenizers:
            raise ValueError("a tokenizer server needs at least one tokenizer")
        self.tokenizers = dict(tokenizers)
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tok")
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    def _tokenizer(self, model: Any) -> ServedTokenizer:
        if isinstance(model, str) and model in self.tokenizers:
            return self.tokenizers[model]
        if len(self.tokenizers) == 1:
            return next(iter(self.tokenizers.values()))
        raise LookupError(f"no tokenizer for model {model!r} (have {sorted(self.tokenizers)})")

    def answer(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The response to one request (runs in a worker thread)."""
        rid = request.get("id")
        op = request.get("op")
        try:
            if op == "ping":
                return {"id": rid, "ok": True}
            tok = self._tokenizer(request.get("model"))
            if op == "tokenize":
                body = request.get("body")
                if not isinstance(body, Mapping):
                    raise ValueError("tokenize needs a map `body`")
                ids = tok.tokenize_request(str(request.get("api", "completions")), body)
            elif op == "encode":
                text = request.get("text")
                if not isinstance(text, str):
                    raise ValueError("encode needs a string `text`")
                ids = tok.encode(text, request.get("add_special_tokens", True) is not False)
            else:
                raise ValueError(f"unknown op {op!r}")
            return {"id": rid, "token_ids": ids}
        except Exception as exc:  # every failure is an answer, never a dropped connection
            return {"id": rid, "error": f"{type(exc).__name__}: {exc}"}

    async def _serve_one(self, request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        response = await loop.run_in_executor(self._pool, self.answer, request)
        if not writer.is_closing():
            writer.write(encode_frame(response))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                request = await read_frame(reader)
                task = asyncio.create_task(self._serve_one(request, writer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ValueError as exc:
            log.warning("closing a tokenizer client connection: %s", exc)
        finally:
            self._writers.discard(writer)
            writer.close()

    async def start(self, address: str, use_tcp: bool = False) -> None:
        if use_tcp:
            host, port = _split_tcp(address)
            self._server = await asyncio.start_server(self._handle, host, port)
        else:
            _prepare_socket_path(address)
            self._server = await asyncio.start_unix_server(self._handle, address)
            os.chmod(address, 0o660)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


def load_models(specs: list[str]) -> dict[str, LocalTokenizer]:
    """`[NAME=]MODEL` specs -> tokenizers; MODEL is a directory or tokenizer.json, or a model
    name found in the local caches. NAME defaults to MODEL. Raises TokenizerNotFoundError."""
    from heimdall_proxy.tokenization.resolve import find_tokenizer

    out: dict[str, LocalTokenizer] = {}
    for spec in specs:
        name, sep, model = spec.partition("=")
        if not sep:
            name = model = spec
        out[name] = LocalTokenizer(find_tokenizer(model))
    return out


async def run_server(
    address: str,
    specs: list[str],
    workers: int = 4,
    use_tcp: bool = False,
    extra: Mapping[str, ServedTokenizer] | None = None,
) -> None:
    """Serve until cancelled (the `tokenizer-server` command). `extra`: tokenizers the caller
    built itself, by model name (the CLI hands in the simulator's, so this package never
    imports the simulator)."""
    tokenizers: dict[str, ServedTokenizer] = dict(load_models(specs))
    tokenizers.update(extra or {})
    server = TokenizerServer(tokenizers, workers)
    await server.start(address, use_tcp)
    log.info(
        "tokenizer service for %s on %s%s",
        ", ".join(sorted(server.tokenizers)),
        "tcp://" if use_tcp else "unix:",
        address,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
