"""The aiohttp application: routes, OpenAI-shaped errors for everything, and the runner."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from heimdall_proxy.config import GatewayConfig
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.framework.types import ApiKind
from heimdall_proxy.server.errors import error_response
from heimdall_proxy.server.gateway import Gateway, ServerOptions

log = logging.getLogger("heimdall_proxy.server")

GATEWAY = web.AppKey("gateway", Gateway)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render routing errors and unexpected exceptions as OpenAI-shaped JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(
            exc.status
        )
        message = exc.reason
        if exc.status == 404:
            message = f"Unknown route: {request.method} {request.path}"
        return error_response(exc.status, message, code=code, headers=_allow(exc))
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response(500, "Internal gateway error.", code="internal_error")


def _allow(exc: web.HTTPException) -> dict[str, str] | None:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else None


def _inference(api: ApiKind) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await request.app[GATEWAY].handle(request, api)

    handler.__name__ = f"handle_{api}"
    return handler


async def list_models(request: web.Request) -> web.Response:
    models = request.app[GATEWAY].pool.models()
    return web.Response(
        body=orjson.dumps({"object": "list", "data": models}), content_type="application/json"
    )


async def health(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def ready(request: web.Request) -> web.Response:
    pool = request.app[GATEWAY].pool
    healthy = len(pool.healthy())
    body = orjson.dumps(
        {"ready": healthy > 0, "healthy_pods": healthy, "pods": len(pool.endpoints())}
    )
    return web.Response(status=200 if healthy else 503, body=body, content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[GATEWAY].metrics.registry)
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp


def create_app(
    config: GatewayConfig, options: ServerOptions | None = None, registry: Registry | None = None
) -> web.Application:
    """Build the app. Raises ConfigError for an invalid config, before any socket is opened."""
    options = options or ServerOptions()
    gateway = Gateway(config, options, registry)
    app = web.Application(client_max_size=options.max_body_bytes, middlewares=[openai_errors])
    app[GATEWAY] = gateway
    app.cleanup_ctx.append(gateway.lifespan)
    app.router.add_post("/v1/completions", _inference("completions"))
    app.router.add_post("/v1/chat/completions", _inference("chat"))
    app.router.add_post("/v1/responses", _inference("responses"))
    app.router.add_get("/v1/models", list_models)
    other = _inference("other")
    app.router.add_post("/v1/{tail:.+}", other)
    app.router.add_post("/tokenize", other)
    app.router.add_post("/detokenize", other)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    """Run until SIGINT/SIGTERM; client disconnects cancel their handler (and so the upstream
    request)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        log.info("heimdall-proxy listening on http://%s:%d", host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()
