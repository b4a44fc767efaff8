"""One simulated vLLM pod.

The model is deliberately simple for now: at most `max_num_seqs` requests run at once (the
rest wait in a FIFO queue, visible as `vllm:num_requests_waiting`), the first token comes
after `ttft` seconds plus `prefill_per_token` per prompt token, and each later token after
`token_delay`. Test knobs let a test hold a stream, break it, override metrics, or answer
with an error status.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from heimdall_proxy.framework.types import ApiKind, extract_prompt_text
from heimdall_proxy.sim.shapes import DONE, Shapes

_WORDS = ("the", "gateway", "routes", "tokens", "to", "a", "pod", "with", "room", "and")


@dataclass(slots=True)
class SimOptions:
    name: str = "sim-0"
    model: str = "sim-model"
    lora_modules: list[str] = field(default_factory=list)
    max_loras: int = 1
    max_num_seqs: int = 256
    ttft: float = 0.0
    prefill_per_token: float = 0.0
    token_delay: float = 0.0
    default_max_tokens: int = 16
    block_size: int = 16
    num_gpu_blocks: int = 4096
    max_model_len: int = 8192


@dataclass(slots=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _max_tokens(data: dict[str, Any], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = data.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return default


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class SimPod:
    """A vLLM-compatible aiohttp app plus the state tests poke at."""

    def __init__(self, options: SimOptions | None = None) -> None:
        self.options = options or SimOptions()
        self._slots = asyncio.Semaphore(self.options.max_num_seqs)
        self.running = 0
        self.waiting = 0
        self.received: list[Received] = []
        self.completed = 0
        self.cancelled = 0
        # ---- test knobs ----
        #: When set, streams pause after their first chunk until the event is set.
        self.hold: asyncio.Event | None = None
        #: When set, streams abort the connection after this many chunks.
        self.break_stream_after: int | None = None
        #: When set, inference routes answer with this status and an error body.
        self.fail_status: int | None = None
        #: When set, /metrics answers 500.
        self.metrics_broken = False
        #: Values forced into /metrics (keys: waiting, running, kv_cache_usage).
        self.metrics_override: dict[str, float] = {}

    @property
    def served_models(self) -> list[str]:
        return [self.options.model, *self.options.lora_modules]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/embeddings", self._embeddings)
        for path, api in (
            ("/v1/completions", "completions"),
            ("/v1/chat/completions", "chat"),
            ("/v1/responses", "responses"),
        ):
            app.router.add_post(path, self._inference_handler(api))  # type: ignore[arg-type]
        return app

    # ---- plain routes ---------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

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
        o = self.options
        override = self.metrics_override
        running = override.get("running", self.running)
        waiting = override.get("waiting", self.waiting)
        kv = override.get("kv_cache_usage", min(1.0, self.running / max(1, o.max_num_seqs)))
        labels = f'engine="0",model_name="{o.model}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {float(kv)}",
            "# HELP vllm:lora_requests_info Running stats on lora requests.",
            "# TYPE vllm:lora_requests_info gauge",
            f'vllm:lora_requests_info{{max_lora="{o.max_loras}",running_lora_adapters="",'
            f'waiting_lora_adapters=""}} {time.time()}',
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{o.block_size}",cache_dtype="auto",'
            f'enable_prefix_caching="True",num_gpu_blocks="{o.num_gpu_blocks}"}} 1.0',
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{labels}}} 0.0",
            "",
        ]
        return "\n".join(lines)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_broken:
            return web.Response(status=500, text="broken")
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    async def _tokenize(self, request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        text = str(data.get("prompt", ""))
        tokens = list(range(_tokens(text)))
        body = {"tokens": tokens, "count": len(tokens), "max_model_len": self.options.max_model_len}
        return web.json_response(body)

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

    async def _inference(self, request: web.Request, api: ApiKind) -> web.StreamResponse:
        body = await request.read()
        self.received.append(Received(request.method, request.path, dict(request.headers), body))
        if self.fail_status is not None:
            return _error(self.fail_status, f"simulated failure on {self.options.name}")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error(400, "invalid JSON")
        model = data.get("model")
        if model not in self.served_models:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        prompt_tokens = _tokens(extract_prompt_text(api, data))
        n_tokens = _max_tokens(data, self.options.default_max_tokens)
        words = [_WORDS[i % len(_WORDS)] for i in range(n_tokens)]
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            delay = self.options.ttft + self.options.prefill_per_token * prompt_tokens
            if delay:
                await asyncio.sleep(delay)
            shapes = Shapes(str(model), api)
            if data.get("stream") is True:
                return await self._stream(request, api, data, shapes, words, prompt_tokens)
            if self.options.token_delay:
                await asyncio.sleep(self.options.token_delay * n_tokens)
            text = " ".join(words)
            if api == "completions":
                out = shapes.completion(text, "length", prompt_tokens, n_tokens)
            elif api == "chat":
                out = shapes.chat(text, "length", prompt_tokens, n_tokens)
            else:
                out = orjson.dumps(shapes.response_obj("completed", text, prompt_tokens, n_tokens))
            self.completed += 1
            return web.Response(
                body=out, content_type="application/json", headers={"x-sim-pod": self.options.name}
            )
        except (asyncio.CancelledError, ConnectionError):
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
            self._slots.release()

    def _chunks(
        self, api: ApiKind, data: dict[str, Any], shapes: Shapes, words: list[str], prompt: int
    ) -> list[bytes]:
        n = len(words)
        include_usage = bool((data.get("stream_options") or {}).get("include_usage"))
        chunks: list[bytes] = []
        if api == "completions":
            for i, w in enumerate(words):
                chunks.append(
                    shapes.completion_chunk(
                        (" " if i else "") + w, "length" if i == n - 1 else None
                    )
                )
            if include_usage:
                chunks.append(shapes.usage_chunk(prompt, n))
            chunks.append(DONE)
        elif api == "chat":
            chunks.append(shapes.chat_chunk({"role": "assistant", "content": ""}, None))
            for i, w in enumerate(words):
                chunks.append(shapes.chat_chunk({"content": (" " if i else "") + w}, None))
            chunks.append(shapes.chat_chunk({}, "length"))
            if include_usage:
                chunks.append(shapes.usage_chunk(prompt, n))
            chunks.append(DONE)
        else:
            item = shapes.message_item("", "in_progress")
            text = " ".join(words)
            chunks.append(
                shapes.response_event(
                    "response.created", response=shapes.response_obj("in_progress", None, prompt, 0)
                )
            )
            chunks.append(
                shapes.response_event(
                    "response.in_progress",
                    response=shapes.response_obj("in_progress", None, prompt, 0),
                )
            )
            chunks.append(
                shapes.response_event("response.output_item.added", output_index=0, item=item)
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            chunks.append(
                shapes.response_event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    part=part,
                )
            )
            for i, w in enumerate(words):
                chunks.append(
                    shapes.response_event(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=0,
                        content_index=0,
                        delta=(" " if i else "") + w,
                        logprobs=[],
                    )
                )
            chunks.append(
                shapes.response_event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            chunks.append(
                shapes.response_event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    part={**part, "text": text},
                )
            )
            chunks.append(
                shapes.response_event(
                    "response.output_item.done",
                    output_index=0,
                    item=shapes.message_item(text, "completed"),
                )
            )
            chunks.append(
                shapes.response_event(
                    "response.completed", response=shapes.response_obj("completed", text, prompt, n)
                )
            )
        return chunks

    async def _stream(
        self,
        request: web.Request,
        api: ApiKind,
        data: dict[str, Any],
        shapes: Shapes,
        words: list[str],
        prompt: int,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "x-sim-pod": self.options.name}
        )
        await response.prepare(request)
        for i, chunk in enumerate(self._chunks(api, data, shapes, words, prompt)):
            if self.break_stream_after is not None and i >= self.break_stream_after:
                if request.transport is not None:
                    request.transport.abort()
                return response
            if i and self.options.token_delay:
                await asyncio.sleep(self.options.token_delay)
            await response.write(chunk)
            if i == 0 and self.hold is not None:
                await self.hold.wait()
        await response.write_eof()
        self.completed += 1
        return response
