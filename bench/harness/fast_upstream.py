"""A minimal, fast vLLM-shaped upstream for overhead benchmarks.

It answers the handful of endpoints a gateway needs (``/v1/models``, ``/metrics``, ``/health``)
and returns a fixed, precomputed OpenAI-shaped body for ``/v1/completions`` and
``/v1/chat/completions`` with no artificial delay, so that the cost measured in front of it is
the proxy's, not the model server's.

Run: ``python -m bench.harness.fast_upstream --port 8001 [--model bench-model]``
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from aiohttp import web
from aiohttp.web_request import BaseRequest

from bench.harness import cli

JSON_CT = "application/json"
PROM_CT = "text/plain; version=0.0.4; charset=utf-8"
SSE_CT = "text/event-stream"

Handler = Callable[[BaseRequest], Awaitable[web.StreamResponse]]


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Bodies:
    """All response bodies, computed once at start-up."""

    def __init__(self, model: str) -> None:
        self.models = _dumps(
            {
                "object": "list",
                "data": [
                    {
                        "id": model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "vllm",
                        "root": model,
                        "parent": None,
                    }
                ],
            }
        )
        usage = {"prompt_tokens": 8, "completion_tokens": 6, "total_tokens": 14}
        text = "Hello from the bench upstream."
        self.chat = _dumps(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )
        self.completion = _dumps(
            {
                "id": "cmpl-bench",
                "object": "text_completion",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
                "usage": usage,
            }
        )
        self.chat_stream = self._sse(model, "chat.completion.chunk", text, chat=True)
        self.completion_stream = self._sse(model, "text_completion", text, chat=False)
        label = f'model_name="{model}"'
        self.metrics = "".join(
            [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.\n",
                "# TYPE vllm:num_requests_running gauge\n",
                f"vllm:num_requests_running{{{label}}} 0.0\n",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n",
                "# TYPE vllm:num_requests_waiting gauge\n",
                f"vllm:num_requests_waiting{{{label}}} 0.0\n",
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n",
                "# TYPE vllm:kv_cache_usage_perc gauge\n",
                f"vllm:kv_cache_usage_perc{{{label}}} 0.0\n",
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n",
                "# TYPE vllm:cache_config_info gauge\n",
                'vllm:cache_config_info{block_size="16",cache_dtype="auto",'
                'enable_prefix_caching="True",gpu_memory_utilization="0.9",'
                f'num_cpu_blocks="0",num_gpu_blocks="1000",{label}}} 1.0\n',
            ]
        ).encode()

    @staticmethod
    def _sse(model: str, obj: str, text: str, *, chat: bool) -> list[bytes]:
        chunks: list[bytes] = []
        words = text.split(" ")
        for i, word in enumerate(words):
            piece = word if i == 0 else " " + word
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": None}
            if chat:
                choice["delta"] = (
                    {"content": piece} if i else {"role": "assistant", "content": piece}
                )
            else:
                choice["text"] = piece
            if i == len(words) - 1:
                choice["finish_reason"] = "stop"
            event = {
                "id": "bench",
                "object": obj,
                "created": 0,
                "model": model,
                "choices": [choice],
            }
            chunks.append(b"data: " + _dumps(event) + b"\n\n")
        chunks.append(b"data: [DONE]\n\n")
        return chunks


def _wants_stream(body: bytes) -> bool:
    # Only pay for a JSON parse when the request could possibly ask for streaming.
    if b'"stream"' not in body:
        return False
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def make_handler(bodies: Bodies) -> Handler:
    json_headers = {"Content-Type": JSON_CT}
    prom_headers = {"Content-Type": PROM_CT}

    async def stream(request: BaseRequest, chunks: list[bytes]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": SSE_CT, "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def handler(request: BaseRequest) -> web.StreamResponse:
        method = request.method
        path = request.path
        if method == "POST":
            body = await request.read()
            if path == "/v1/chat/completions":
                if _wants_stream(body):
                    return await stream(request, bodies.chat_stream)
                return web.Response(body=bodies.chat, headers=json_headers)
            if path == "/v1/completions":
                if _wants_stream(body):
                    return await stream(request, bodies.completion_stream)
                return web.Response(body=bodies.completion, headers=json_headers)
        elif method in ("GET", "HEAD"):
            if path == "/v1/models":
                return web.Response(body=bodies.models, headers=json_headers)
            if path == "/metrics":
                return web.Response(body=bodies.metrics, headers=prom_headers)
            if path in ("/health", "/ping"):
                return web.Response(status=200)
        else:
            return web.Response(status=405)
        return web.Response(
            status=404,
            body=_dumps({"object": "error", "message": f"no route {method} {path}", "code": 404}),
            headers=json_headers,
        )

    return handler


async def serve(host: str, port: int, model: str) -> None:
    loop = asyncio.get_running_loop()
    server = web.Server(make_handler(Bodies(model)), access_log=None)
    # aiohttp sets TCP_NODELAY on every accepted connection itself.
    srv = await loop.create_server(server, host, port, reuse_address=True, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"fast_upstream listening on http://{host}:{port} model={model}", flush=True)
    try:
        await stop.wait()
    finally:
        srv.close()
        await server.shutdown(1.0)
        await srv.wait_closed()


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="bench-model")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.host, args.port, args.model))


if __name__ == "__main__":
    main()
