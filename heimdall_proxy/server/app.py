"""The aiohttp application: routes, OpenAI-shaped errors for everything, and the runner."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import unquote

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from heimdall_proxy.config.gateway import GatewayConfig
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.requesthandling.parsers import STANDARD_ROUTES
from heimdall_proxy.server.auth import Auth
from heimdall_proxy.server.collector import settle
from heimdall_proxy.server.connections import protocol_factory
from heimdall_proxy.server.debug import DEBUG_PREFIX, DEBUG_ROUTES, debug_handler
from heimdall_proxy.server.errors import error_response, render
from heimdall_proxy.server.gateway import GATEWAY, Gateway
from heimdall_proxy.server.live import live_routes
from heimdall_proxy.server.stored import delete_response, get_response, list_input_items

log = logging.getLogger(__name__)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: After the drain, how long aiohttp gives each connection's handler to end (twice: once to
#: finish, once to stop after cancelling it).
SHUTDOWN_GRACE = 0.25


def openai_errors(handler: Handler) -> Handler:
    """`handler` with routing errors and unexpected exceptions rendered as JSON in the shape of
    the path's API (OpenAI's, or Anthropic's on the Messages API).
    A wrapper per route rather than an aiohttp middleware: aiohttp's middleware chain cost
    ~5% of the gateway's CPU per request (bench/RESULTS.md)."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            check_target(request.raw_path)
            return await handler(request)
        except RequestError as exc:
            return render(exc, request.path)
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
    return render(
        RequestError(exc.status, message, code=code, headers={"Allow": allow} if allow else None),
        request.path,
    )


async def unrouted(request: web.Request) -> web.StreamResponse:
    """The last route, matching every path and method: 405 (with Allow) for a known path asked
    with another method, else 404, both in the shape of the path's API."""
    allowed: set[str] = set()
    itself = request.match_info.route.resource
    inference = request.app[INFERENCE_RESOURCES]
    for resource in request.app.router.resources():
        if resource is not itself and resource not in inference:
            allowed |= (await resource.resolve(request))[1]
    if request.app[GATEWAY].plugins.parsers.claimed(request.path) is not None:
        allowed.add("POST")
    if allowed:
        return _http_error(request, web.HTTPMethodNotAllowed(request.method, sorted(allowed)))
    return _http_error(request, web.HTTPNotFound())


UNROUTED_PATH = "/{tail:.*}"
#: The inference routes' resources, which `unrouted` does not count (the parsers in force
#: say whether a path is one).
INFERENCE_RESOURCES: web.AppKey[frozenset[web.AbstractResource]] = web.AppKey("inference_resources")


def _inference(gateway: Gateway, auth: Auth, allow_routes: Sequence[str]) -> Handler:
    """The inference route, behind `auth`: every POST path that a parser in force claims
    (`requestHandler.parsers`, which a reload may change), and the paths `--allow-route`
    lists (an admin key needed; a fallback parser such as passthrough-parser reads them);
    any other path is unrouted. One plain function that authenticates and hands back the
    gateway's coroutine: no frame of its own to pass through on every suspension, no app
    lookup. The gateway object lives as long as the app; a reload swaps its routing."""
    caller = auth.caller
    identifies = auth.identifies  # without keys or owner header every caller is ""
    allowed = frozenset(allow_routes)

    def handler(request: web.Request) -> Awaitable[web.StreamResponse]:
        path = request.path
        if gateway.plugins.parsers.claimed(path) is not None:
            return gateway.handle(request, caller(request, False) if identifies else "")
        if path in allowed:
            return gateway.handle(request, caller(request, True) if identifies else "")
        return unrouted(request)

    handler.__name__ = "handle_inference"
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
        ("GET", "/v1/models", user(list_models)),
        ("GET", "/v1/responses/{response_id}", user(get_response)),
        ("DELETE", "/v1/responses/{response_id}", user(delete_response)),
        ("GET", "/v1/responses/{response_id}/input_items", user(list_input_items)),
        ("GET", "/health", health),
        ("GET", "/ready", ready),
        ("GET", "/metrics", metrics),
    ]
    if options.debug_routes:
        routes += [
            ("POST", DEBUG_PREFIX + path, admin(debug_handler(path))) for path in DEBUG_ROUTES
        ]
    if options.live_page:
        routes += [
            (method, path, admin(handler) if guarded else handler)
            for method, path, handler, guarded in live_routes()
        ]
    for method, path, handler in routes:
        if method == "GET":  # and HEAD, as aiohttp's add_get does
            app.router.add_get(path, openai_errors(handler))
        else:
            app.router.add_route(method, path, openai_errors(handler))
    # Inference: what the parsers claim; anything else a pod serves (adapter loading,
    # /tokenize, ...) only when allowlisted.
    # The standard routes as plain resources first: aiohttp finds those by a dict lookup,
    # while the catch-all is a pattern matched on every request that reaches it (measured:
    # the catch-all alone cost 7% of a request's instructions).
    inference = openai_errors(_inference(gateway, auth, options.allow_routes))
    resources = set()
    for path in (*STANDARD_ROUTES, UNROUTED_PATH):
        route = app.router.add_route("POST", path, inference)
        assert route.resource is not None
        resources.add(route.resource)
    app[INFERENCE_RESOURCES] = frozenset(resources)
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
