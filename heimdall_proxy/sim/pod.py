"""One simulated vLLM pod: vLLM's HTTP API in vLLM's shapes in front of the engine model in
engine.py, with KV events on ZMQ (kvevents.py) and /metrics (metrics.py).

Test knobs let a test hold a stream, break it, override metrics, or answer with an error
status; they act on the HTTP side only, the engine keeps its own pace.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from heimdall_proxy.sim.engine import Engine, Seq, Status
from heimdall_proxy.sim.kvevents import KVEvent, KVEventPublisher
from heimdall_proxy.sim.metrics import LoraInfo, render
from heimdall_proxy.sim.options import SimOptions
from heimdall_proxy.sim.prompt import ApiKind
from heimdall_proxy.sim.shapes import DONE, Shapes, usage
from heimdall_proxy.sim.tokens import WORDS, OutputWords, Prompt, PromptError, Tokenizer

__all__ = ["WORDS", "Received", "SimOptions", "SimPod"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def _max_tokens(data: Mapping[str, Any], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def _cache_salt(data: Mapping[str, Any]) -> str | None:
    """vLLM's `cache_salt`: a non-empty string keeps the prompt's blocks apart."""
    salt = data.get("cache_salt")
    return salt if isinstance(salt, str) and salt else None


def _stop_words(data: Mapping[str, Any]) -> tuple[str, ...]:
    stop = data.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list):
        return ()
    return tuple(s.strip() for s in stop if isinstance(s, str) and s.strip())


def _error(
    status: int, message: str, kind: str = "BadRequestError", param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class _StreamBroken(Exception):
    """The break_stream_after knob cut the connection."""


class _Aborted(Exception):
    """The engine dropped the request (it is stopping)."""


#: vLLM's finish reasons as the Messages API's stop reasons.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


class _Emitter:
    """Writes SSE chunks, applying the hold and break_stream_after knobs."""

    __slots__ = ("count", "pod", "request", "response")

    def __init__(self, pod: SimPod, request: web.Request, response: web.StreamResponse) -> None:
        self.pod = pod
        self.request = request
        self.response = response
        self.count = 0

    async def __call__(self, chunk: bytes) -> None:
        limit = self.pod.break_stream_after
        if limit is not None and self.count >= limit:
            if self.request.transport is not None:
                self.request.transport.abort()
            raise _StreamBroken
        await self.response.write(chunk)
        if self.count == 0 and self.pod.hold is not None:
            await self.pod.hold.wait()
        self.count += 1


class SimPod:
    """A vLLM-compatible aiohttp app plus the state tests poke at."""

    def __init__(self, options: SimOptions | None = None) -> None:
        self.options = o = options or SimOptions()
        self.engine_id = o.engine_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"sim://{o.name}"))
        self.tokenizer = Tokenizer(o.mm_tokens_per_item)
        self.kv_events_enabled = bool(o.kv_events_port)
        self.publisher: KVEventPublisher | None = None
        self.engine = Engine(o, on_events=self._publish if self.kv_events_enabled else None)
        self.received: list[Received] = []
        self.completed = 0
        self.cancelled = 0
        self._ids = itertools.count()
        self._lora_info = LoraInfo()
        # ---- test knobs ----
        #: When set, streams pause after their first chunk until the event is set.
        self.hold: asyncio.Event | None = None
        #: When set, streams abort the connection after this many chunks.
        self.break_stream_after: int | None = None
        #: When set, inference routes answer with this status and an error body.
        self.fail_status: int | None = None
        #: When set, /metrics answers 500.
        self.metrics_broken = False
        #: When set, /health answers this status (an engine that stopped, /metrics still up).
        self.health_status: int | None = None
        #: Values forced into /metrics (keys: waiting, running, kv_cache_usage).
        self.metrics_override: dict[str, float] = {}

    # ---- state --------------------------------------------------------------------------
    @property
    def running(self) -> int:
        """Requests in the engine's running batch."""
        return self.engine.num_running

    @property
    def waiting(self) -> int:
        """Requests in the engine's waiting queue (including those pulling KV)."""
        return self.engine.num_waiting

    @property
    def served_models(self) -> list[str]:
        return [self.options.model, *self.options.lora_modules]

    @property
    def kv_events_endpoint(self) -> str | None:
        return self.publisher.endpoint if self.publisher else None

    @property
    def kv_replay_endpoint(self) -> str | None:
        return self.publisher.replay_endpoint if self.publisher else None

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the KV-event sockets and start the engine (the app does it on startup)."""
        o = self.options
        if self.kv_events_enabled and self.publisher is None:
            assert o.kv_events_port is not None
            topic = o.kv_events_topic.format(name=o.name, model=o.model, host=o.advertise_host)
            self.publisher = KVEventPublisher(
                o.kv_events_host,
                o.kv_events_port,
                o.kv_events_replay_port,
                topic,
                o.kv_events_format,
                o.kv_events_hash,
                o.kv_events_buffer,
            )
            self.publisher.start()
            log.info(
                "sim pod %s: KV events on %s (replay %s)",
                o.name,
                self.publisher.endpoint,
                self.publisher.replay_endpoint,
            )
        self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()
        if self.publisher is not None:
            await self.publisher.close()
            self.publisher = None

    async def _on_shutdown(self, app: web.Application) -> None:
        await self.engine.stop()

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        await self.start()
        yield
        await self.stop()

    async def _tag_response(self, request: web.Request, response: web.StreamResponse) -> None:
        # Every answer, errors included, names the pod that gave it.
        response.headers.setdefault("x-sim-pod", self.options.name)

    def _publish(self, events: list[KVEvent]) -> None:
        if self.publisher is not None:
            self.publisher.publish(events)

    @web.middleware
    async def _check_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """vLLM's --api-key: the /v1 routes need the key; /health and /metrics do not."""
        if request.path.startswith("/v1") and (
            request.headers.get("Authorization") != f"Bearer {self.options.api_key}"
        ):
            return _error(401, "Unauthorized", "AuthenticationError")
        response: web.StreamResponse = await handler(request)
        return response

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.cleanup_ctx.append(self._lifecycle)
        # On shutdown the engine stops first, so in-flight requests end at once instead of
        # holding the server's graceful shutdown for as long as they would have run.
        app.on_shutdown.append(self._on_shutdown)
        app.on_response_prepare.append(self._tag_response)
        if self.options.api_key:
            app.middlewares.append(self._check_key)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_post("/tokenize", self._tokenize)
        # vLLM's render endpoints (served with --enable-scale-out, or by `vllm launch render`)
        app.router.add_post("/v1/completions/render", self._render)
        app.router.add_post("/v1/chat/completions/render", self._render)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        app.router.add_post("/v1/embeddings", self._embeddings)
        if self.options.fault_control:
            app.router.add_post("/sim/fault", self._fault)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        for path, api in (
            ("/v1/completions", "completions"),
            ("/v1/chat/completions", "chat"),
            ("/v1/responses", "responses"),
            ("/v1/messages", "messages"),
        ):
            app.router.add_post(path, self._inference_handler(api))  # type: ignore[arg-type]
        return app

    # ---- plain routes ---------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        if self.health_status is not None:  # a stuck engine: vLLM's /health answers 5xx
            return web.Response(status=self.health_status)
        return web.Response()

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0+heimdall-sim"})

    async def _models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {
                "id": self.options.model,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.options.model,
                "parent": None,
                "max_model_len": self.options.max_model_len,
            }
        ]
        data += [
            {
                "id": lora,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": lora,
                "parent": self.options.model,
            }
            for lora in self.options.lora_modules
        ]
        return web.json_response({"object": "list", "data": data})

    def metrics_text(self) -> str:
        return render(self.options, self.engine, self._lora_info, self.metrics_override)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_broken:
            return web.Response(status=500, text="broken")
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    async def _prompt_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The JSON object body of a tokenize or render request, or the error answering it
        (not JSON, not an object, a model this pod does not serve)."""
        try:
            data = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "invalid JSON")
        if not isinstance(data, dict):
            return _error(400, "the body must be a JSON object")
        model = data.get("model")
        if model is not None and model not in self.served_models:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return data

    async def _tokenize(self, request: web.Request) -> web.Response:
        data = await self._prompt_body(request)
        if isinstance(data, web.Response):
            return data
        try:
            if "messages" in data:
                prompt = self.tokenizer.chat(
                    data["messages"], bool(data.get("add_generation_prompt", True))
                )
            else:
                prompt = self.tokenizer.completion(data)
                if data.get("add_special_tokens") is False and prompt.ids[:1] == [1]:
                    prompt.ids = prompt.ids[1:]
        except PromptError as exc:
            return _error(400, str(exc))
        body = {
            "count": len(prompt.ids),
            "max_model_len": self.options.max_model_len,
            "tokens": prompt.ids,
            "token_strs": None,
        }
        return web.json_response(body)

    async def _render(self, request: web.Request) -> web.Response:
        """The prompt's token ids as vLLM's render endpoints give them: for a chat request one
        GenerateRequest-shaped object, for a completion a list of them (one per prompt; the
        simulator takes one prompt per request)."""
        data = await self._prompt_body(request)
        if isinstance(data, web.Response):
            return data
        chat = request.path.startswith("/v1/chat/")
        try:
            if chat:
                prompt = self.tokenizer.chat(data.get("messages") or [], True)
            else:
                prompt = self.tokenizer.completion(data)
        except PromptError as exc:
            return _error(400, str(exc))
        rendered = {"model": data.get("model"), "token_ids": prompt.ids}
        return web.json_response(rendered if chat else [rendered])

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        if not self.engine.reset_prefix_cache():
            return _error(409, "blocks are in use; reset_prefix_cache refused")
        return web.Response()

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append(Received(request.method, request.path, dict(request.headers), body))
        data = orjson.loads(body)
        return web.json_response(
            {
                "object": "list",
                "model": data.get("model"),
                "data": [{"object": "embedding", "index": 0, "embedding": [0.0, 0.5, 1.0]}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        )

    # ---- inference --------------------------------------------------------------------

    def _inference_handler(self, api: ApiKind) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._inference(request, api)

        return handler

    def _remote_encoded(self, data: Mapping[str, Any], prompt: Prompt) -> frozenset[str]:
        """Multimodal items whose encoder output came from an encode pod: named in the
        request's ec_transfer_params, or present in the shared EC storage."""
        done: set[str] = set()
        params = data.get("ec_transfer_params")
        if isinstance(params, Mapping):
            for mm_hash, item in params.items():
                if isinstance(item, Mapping) and item.get("do_remote_encode"):
                    done.add(str(mm_hash))
        path = self.options.ec_storage_path
        if path:
            done.update(
                m.mm_hash for m in prompt.mm if os.path.exists(os.path.join(path, m.mm_hash))
            )
        return frozenset(done)

    def _build(self, api: ApiKind, data: Mapping[str, Any], model: str) -> Seq | web.Response:
        o = self.options
        try:
            prompt = self.tokenizer.prompt(api, data)
        except PromptError as exc:
            return _error(400, str(exc))
        max_tokens = _max_tokens(data, o.default_max_tokens)
        kv_params = data.get("kv_transfer_params")
        xargs = data.get("vllm_xargs")
        if kv_params is None and isinstance(xargs, Mapping):
            kv_params = xargs.get("kv_transfer_params")  # vLLM reads it from there too
        if kv_params is not None and not isinstance(kv_params, Mapping):
            # vLLM's handler fails on it with an internal error, on every pod alike
            return _error(500, "kv_transfer_params must be an object", "InternalServerError")
        kv_params = kv_params if isinstance(kv_params, Mapping) else {}
        prefill_only = bool(kv_params.get("do_remote_decode"))
        if prefill_only:
            max_tokens = 1
        limit = min(o.max_model_len, self.engine.capacity_tokens)
        total = len(prompt.ids) + max_tokens
        if total > limit:
            return _error(
                400,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {total} tokens ({len(prompt.ids)} in the messages, {max_tokens} "
                "in the completion). Please reduce the length of the messages or completion.",
            )
        lora = model if model != o.model else None
        lora_id = o.lora_modules.index(model) + 1 if lora else None
        return Seq(
            f"{o.name}-{next(self._ids)}",
            prompt.ids,
            max_tokens,
            OutputWords(o.seed, data.get("seed"), prompt.ids),
            lora=lora,
            lora_id=lora_id,
            mm=prompt.mm,
            remote_encoded=self._remote_encoded(data, prompt),
            remote_prefill=bool(kv_params.get("do_remote_prefill")),
            prefill_only=prefill_only,
            encode_only=o.role == "encode",
            stop=_stop_words(data),
            cache_salt=_cache_salt(data),
        )

    def _extra_fields(self, seq: Seq) -> dict[str, Any]:
        """kv_transfer_params of a prefill pod, ec_transfer_params of an encode pod."""
        o = self.options
        extra: dict[str, Any] = {}
        if seq.kv_transfer_out is not None:
            extra["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": seq.kv_transfer_out,
                "remote_engine_id": self.engine_id,
                "remote_request_id": seq.id,
                "remote_host": o.advertise_host,
                "remote_port": o.side_channel_port,
                "tp_size": 1,
            }
        if seq.encode_only and seq.mm and o.ec_transfer_params:
            extra["ec_transfer_params"] = {
                m.mm_hash: {
                    "do_remote_encode": True,
                    "num_encoder_tokens": m.num_tokens,
                    "remote_engine_id": self.engine_id,
                    "remote_host": o.advertise_host,
                    "remote_port": o.side_channel_port,
                }
                for m in seq.mm
            }
        if seq.encode_only and seq.mm and o.ec_storage_path:
            os.makedirs(o.ec_storage_path, exist_ok=True)
            for m in seq.mm:
                with open(os.path.join(o.ec_storage_path, m.mm_hash), "wb"):
                    pass
        return extra

    async def _fault(self, request: web.Request) -> web.Response:
        """Set the failure knobs from another process (`--fault-control`)."""
        try:
            doc = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "invalid JSON")
        if not isinstance(doc, dict):
            return _error(400, "the body must be a JSON object")
        for key in ("fail_status", "health_status"):
            if key in doc:
                value = doc[key]
                if value is not None and (not isinstance(value, int) or not 100 <= value < 600):
                    return _error(400, f"{key} must be an HTTP status or null")
                setattr(self, key, value)
        state = {"fail_status": self.fail_status, "health_status": self.health_status}
        return web.json_response(state)

    async def _inference(self, request: web.Request, api: ApiKind) -> web.StreamResponse:
        body = await request.read()
        self.received.append(Received(request.method, request.path, dict(request.headers), body))
        if self.fail_status is not None:
            return _error(self.fail_status, f"simulated failure on {self.options.name}")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error(400, "invalid JSON")
        if not isinstance(data, dict):
            return _error(400, "the body must be a JSON object")
        model = data.get("model")
        if model not in self.served_models:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        built = self._build(api, data, str(model))
        if isinstance(built, web.Response):
            return built
        seq = built
        shapes = Shapes(str(model), api)
        self.engine.submit(seq)
        try:
            if data.get("stream") is True:
                return await self._stream(request, api, data, shapes, seq)
            await seq.wait_done()
            if seq.status is Status.ABORTED:
                return _error(503, "the engine stopped", "ServiceUnavailableError")
            out = self._body(api, shapes, seq)
            self.completed += 1
            return web.Response(body=out, content_type="application/json")
        except (asyncio.CancelledError, ConnectionError):
            self.cancelled += 1
            raise
        finally:
            self.engine.abort(seq)  # a no-op once it finished

    def _body(self, api: ApiKind, shapes: Shapes, seq: Seq) -> bytes:
        text, n = seq.text, seq.num_output
        finish = seq.finish_reason or "length"
        extra = self._extra_fields(seq)
        if api == "completions":
            return shapes.completion(text, finish, seq.prompt_len, n, seq.cached_tokens, **extra)
        if api == "chat":
            return shapes.chat(text, finish, seq.prompt_len, n, seq.cached_tokens, **extra)
        if api == "messages":
            stop = STOP_REASONS.get(finish, finish)
            return orjson.dumps(shapes.message(text, stop, seq.prompt_len, n, seq.cached_tokens))
        obj = shapes.response_obj("completed", text, seq.prompt_len, n, seq.cached_tokens)
        return orjson.dumps({**obj, **extra})

    async def _stream(
        self,
        request: web.Request,
        api: ApiKind,
        data: Mapping[str, Any],
        shapes: Shapes,
        seq: Seq,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        emit = _Emitter(self, request, response)
        options = data.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        # vLLM: usage in every event only when include_usage is on too
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        try:
            if api == "responses":
                await self._responses_stream(emit, shapes, seq)
            elif api == "messages":
                await self._messages_stream(emit, shapes, seq)
            else:
                await self._chunks_stream(emit, api, shapes, seq, continuous)
                if include_usage:
                    await emit(
                        shapes.usage_chunk(seq.prompt_len, seq.num_output, seq.cached_tokens)
                    )
                await emit(DONE)
        except _StreamBroken:
            return response
        except _Aborted:
            if request.transport is not None:
                request.transport.abort()
            return response
        await response.write_eof()
        self.completed += 1
        return response

    @staticmethod
    async def _progress(seq: Seq, sent: int) -> None:
        """Wait until the request has more than `sent` tokens or has ended."""
        while seq.num_output <= sent and not seq.done:
            seq.changed.clear()
            await seq.changed.wait()
        if seq.status is Status.ABORTED:
            raise _Aborted

    async def _chunks_stream(
        self, emit: _Emitter, api: ApiKind, shapes: Shapes, seq: Seq, continuous: bool = False
    ) -> None:
        sent = 0

        def running(n: int) -> dict[str, Any] | None:
            return usage(seq.prompt_len, n, seq.cached_tokens) if continuous else None

        started = False
        finish_sent = False
        while True:
            await self._progress(seq, sent)
            if api == "chat" and not started:
                await emit(
                    shapes.chat_chunk({"role": "assistant", "content": ""}, None, running(0))
                )
            started = True
            words = seq.output_words[sent:]
            end = seq.num_output
            for i, word in enumerate(words, start=sent):
                last = seq.done and i == end - 1
                finish = seq.finish_reason if last else None
                piece = (" " if i else "") + word
                if api == "chat":
                    await emit(shapes.chat_chunk({"content": piece}, finish, running(i + 1)))
                else:
                    await emit(shapes.completion_chunk(piece, finish, running(i + 1)))
                finish_sent = finish_sent or last
            sent = end
            if seq.done:
                break
        if not finish_sent:
            if api == "chat":
                await emit(shapes.chat_chunk({"content": ""}, seq.finish_reason, running(sent)))
            else:
                await emit(shapes.completion_chunk("", seq.finish_reason, running(sent)))

    async def _messages_stream(self, emit: _Emitter, shapes: Shapes, seq: Seq) -> None:
        """Anthropic's event sequence: message_start (the prompt's usage), a text block's
        start, deltas and stop, message_delta (stop reason, output usage), message_stop."""
        start = shapes.message(None, None, seq.prompt_len, 0, seq.cached_tokens)
        await emit(shapes.message_event("message_start", message=start))
        block = {"type": "text", "text": ""}
        sent = 0
        started = False
        while True:
            await self._progress(seq, sent)
            if not started:
                await emit(
                    shapes.message_event("content_block_start", index=0, content_block=block)
                )
                started = True
            end = seq.num_output
            for i, word in enumerate(seq.output_words[sent:end], start=sent):
                delta = {"type": "text_delta", "text": (" " if i else "") + word}
                await emit(shapes.message_event("content_block_delta", index=0, delta=delta))
            sent = end
            if seq.done:
                break
        await emit(shapes.message_event("content_block_stop", index=0))
        stop = STOP_REASONS.get(seq.finish_reason or "length", seq.finish_reason)
        await emit(
            shapes.message_event(
                "message_delta",
                delta={"stop_reason": stop, "stop_sequence": None},
                usage={"output_tokens": seq.num_output},
            )
        )
        await emit(shapes.message_event("message_stop"))

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """vLLM's /v1/messages/count_tokens: the prompt's tokens, nothing generated."""
        body = await request.read()
        self.received.append(Received(request.method, request.path, dict(request.headers), body))
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error(400, "invalid JSON")
        if not isinstance(data, dict):
            return _error(400, "the body must be a JSON object")
        try:
            prompt = self.tokenizer.prompt("messages", data)
        except PromptError as exc:
            return _error(400, str(exc))
        return web.json_response({"input_tokens": len(prompt.ids)})

    async def _responses_stream(self, emit: _Emitter, shapes: Shapes, seq: Seq) -> None:
        prompt = seq.prompt_len
        await emit(
            shapes.response_event(
                "response.created", response=shapes.response_obj("in_progress", None, prompt, 0)
            )
        )
        await emit(
            shapes.response_event(
                "response.in_progress",
                response=shapes.response_obj("in_progress", None, prompt, 0),
            )
        )
        item = shapes.message_item("", "in_progress")
        part = {"type": "output_text", "text": "", "annotations": []}
        sent = 0
        started = False
        while True:
            await self._progress(seq, sent)
            if not started:
                await emit(
                    shapes.response_event("response.output_item.added", output_index=0, item=item)
                )
                await emit(
                    shapes.response_event(
                        "response.content_part.added",
                        item_id=item["id"],
                        output_index=0,
                        content_index=0,
                        part=part,
                    )
                )
                started = True
            end = seq.num_output
            for i, word in enumerate(seq.output_words[sent:end], start=sent):
                await emit(
                    shapes.response_event(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=0,
                        content_index=0,
                        delta=(" " if i else "") + word,
                        logprobs=[],
                    )
                )
            sent = end
            if seq.done:
                break
        text, n = seq.text, seq.num_output
        await emit(
            shapes.response_event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                text=text,
                logprobs=[],
            )
        )
        await emit(
            shapes.response_event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                part={**part, "text": text},
            )
        )
        await emit(
            shapes.response_event(
                "response.output_item.done",
                output_index=0,
                item=shapes.message_item(text, "completed"),
            )
        )
        await emit(
            shapes.response_event(
                "response.completed",
                response=shapes.response_obj("completed", text, prompt, n, seq.cached_tokens),
            )
        )
