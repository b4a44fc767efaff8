"""The aiohttp application: routes, OpenAI-shaped errors for everything, and the runner."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from heimdall_proxy.config.gateway import GatewayConfig
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.framework.types import ApiKind
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.server.auth import Auth
from heimdall_proxy.server.collector import settle
from heimdall_proxy.server.connections import protocol_factory
from heimdall_proxy.server.debug import DEBUG_PREFIX, DEBUG_ROUTES, debug_handler
from heimdall_proxy.server.errors import error_response, render
from heimdall_proxy.server.gateway import GATEWAY, Gateway
from heimdall_proxy.server.stored import delete_response, get_response, list_input_items

log = logging.getLogger(__name__)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: After the drain, how long aiohttp gives each connection's handler to end (twice: once to
#: finish, once to stop after cancelling it).
SHUTDOWN_GRACE = 0.25


def openai_errors(handler: Handler) -> Handler:
    """`handler` with routing errors and unexpected exceptions rendered as OpenAI-shaped JSON.
    A wrapper per route rather than an aiohttp middleware: aiohttp's middleware chain cost
    ~5% of the gateway's CPU per request (bench/RESULTS.md)."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            check_target(request.raw_path)
            return await handler(request)
        except RequestError as exc:
            return render(exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _http_error(request, exc)
        except Exception:
            log.exception("unhandled error serving %s %s", request.method, request.path)
            return error_response(500, "Internal gateway error.", code="internal_error")

    return wrapped


def check_target(raw_path: str) -> None:
    """Reject request targets a reverse proxy must not pass on: absolute-form (the path is
    appended to a pod's URL) and `..` segments, plain or percent-encoded (a pod or anything
    behind it may resolve them). Raises RequestError(400)."""
    if not raw_path.startswith("/"):
        raise RequestError(
            400, "The request target must be a path (origin-form).", code="invalid_path"
        )
    if ".." in raw_path or "%2" in raw_path.lower():
        path = unquote(raw_path.partition("?")[0])
        if ".." in path.replace("\\", "/").split("/"):
            raise RequestError(400, "The request path has a '..' segment.", code="invalid_path")


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
    message = exc.reason
    if exc.status == 404:
        message = f"Unknown route: {request.method} {request.path}"
    allow = exc.headers.get("Allow")
    return error_response(
        exc.status, message, code=code, headers={"Allow": allow} if allow else None
    )


async def unrouted(request: web.Request) -> web.StreamResponse:
    """The last route, matching every path and method: 405 (with Allow) for a known path asked
    with another method, else 404, both OpenAI-shaped."""
    allowed: set[str] = set()
    itself = request.match_info.route.resource
    for resource in request.app.router.resources():
        if resource is not itself:
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        return _http_error(request, web.HTTPMethodNotAllowed(request.method, sorted(allowed)))
    return _http_error(request, web.HTTPNotFound())


UNROUTED_PATH = "/{tail:.*}"


def _inference(gateway: Gateway, auth: Auth, api: ApiKind, admin: bool = False) -> Handler:
    """The route handler for `api`, behind `auth` (`admin`: an admin key needed): one plain
    function that authenticates and hands back the gateway's coroutine. No frame of its own
    to pass through on every suspension, no app lookup, and no keeping the caller on the
    request to read it back (aiohttp's request mapping: four Python calls). The gateway
    object lives as long as the app; a reload swaps its routing, not it."""
    caller = auth.caller
    if not auth.identifies:  # no keys, no owner header: every caller is "" and none refused

        def handler(request: web.Request) -> Awaitable[web.StreamResponse]:
            return gateway.handle(request, api, "")

    else:

        def handler(request: web.Request) -> Awaitable[web.StreamResponse]:
            return gateway.handle(request, api, caller(request, admin))

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
    gateway = request.app[GATEWAY]
    pool = gateway.pool
    healthy = len(pool.healthy())
    is_ready = healthy > 0 and not gateway.draining
    body = orjson.dumps(
        {
            "ready": is_ready,
            "healthy_pods": healthy,
            "pods": len(pool.endpoints()),
            "draining": gateway.draining,
        }
    )
    return web.Response(status=200 if is_ready else 503, body=body, content_type="application/json")


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
    gateway = Gateway(config, options, registry or load_builtin_plugins())
    app = web.Application(client_max_size=options.max_body_bytes)
    app[GATEWAY] = gateway
    app.cleanup_ctx.append(gateway.lifespan)
    auth = Auth(options.api_keys, options.admin_api_keys, options.owner_header)
    user, admin = auth.guard, functools.partial(auth.guard, admin=True)
    routes: list[tuple[str, str, Handler]] = [
        ("POST", "/v1/completions", _inference(gateway, auth, "completions")),
        ("POST", "/v1/chat/completions", _inference(gateway, auth, "chat")),
        ("POST", "/v1/responses", _inference(gateway, auth, "responses")),
        ("POST", "/v1/embeddings", _inference(gateway, auth, "other")),
        ("GET", "/v1/models", user(list_models)),
        ("GET", "/v1/responses/{response_id}", user(get_response)),
        ("DELETE", "/v1/responses/{response_id}", user(delete_response)),
        ("GET", "/v1/responses/{response_id}/input_items", user(list_input_items)),
        ("GET", "/health", health),
        ("GET", "/ready", ready),
        ("GET", "/metrics", metrics),
    ]
    # Anything else a pod serves (adapter loading, /tokenize, ...) only when allowlisted.
    other = _inference(gateway, auth, "other", admin=True)
    routes += [("POST", path, other) for path in options.allow_routes]
    if options.debug_routes:
        routes += [
            ("POST", DEBUG_PREFIX + path, admin(debug_handler(api, path)))
            for path, api in DEBUG_ROUTES
        ]
    for method, path, handler in routes:
        if method == "GET":  # and HEAD, as aiohttp's add_get does
            app.router.add_get(path, openai_errors(handler))
        else:
            app.router.add_route(method, path, openai_errors(handler))
    app.router.add_route("*", UNROUTED_PATH, openai_errors(unrouted))
    return app


async def serve(app: web.Application, options: ServerOptions, banner: str | None = None) -> None:
    """Run until SIGINT/SIGTERM; client disconnects cancel their handler (and so the upstream
    request). `banner` is printed on stdout once the port is open (the demo's how-to)."""
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=options.keepalive_timeout,
        # The drain is waited for here (below): aiohttp would wait its shutdown timeout
        # for a request and then as long again for it to stop, rounded up to seconds.
        shutdown_timeout=SHUTDOWN_GRACE,
    )
    await runner.setup()
    listener: asyncio.Server | None = None
    try:
        assert runner.server is not None
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(
            protocol_factory(runner.server, options.max_connections),
            options.host,
            options.port,
            backlog=1024,
            reuse_address=True,
        )
        log.info("heimdall-proxy listening on http://%s:%d", options.host, options.port)
        if banner:
            print(banner, flush=True)
        # Everything alive now lives as long as the process; requests' garbage is mostly
        # freed by reference counting (server/collector.py).
        settle()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        if options.drain_delay > 0:
            app[GATEWAY].draining = True
            log.info("draining: /ready answers 503 for %.1fs", options.drain_delay)
            stop.clear()  # a second signal skips the rest of the delay
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), options.drain_delay)
        log.info("shutting down; requests in flight get %.0fs", options.drain_timeout)
        listener.close()
        runner.server.pre_shutdown()  # open connections take no further request
        try:
            await asyncio.wait_for(app[GATEWAY].drained(), options.drain_timeout)
        except TimeoutError:
            log.warning(
                "requests still in flight after --drain-timeout %.0fs are cut",
                options.drain_timeout,
            )
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()
