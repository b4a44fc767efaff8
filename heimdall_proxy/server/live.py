"""The live page (`--live-page`): where requests go, as they go.

- `GET /live`: one static page (server/static/live.html, no build step, nothing fetched from
  elsewhere). It holds no data: it polls the routes below, sending the admin key the user
  types in (kept in the tab's sessionStorage) when the gateway checks keys.
- `GET /live/api/pool`: every pod's in-flight load (the gateway's ledger), its last scrape
  (queue, running, KV cache use, age), ejection, and over the recent picks how many went
  there and their mean prefix hit rate; then the recent picks, newest first.
- `GET /live/api/trace/{id}`: the scheduling trace of a recent pick that recorded one (at
  most one request per 0.25 s does, server/picks.py).
- `POST /live/api/decide/v1/chat/completions` (and the debug route's other paths): the
  debug route's decision for a pasted body, nothing forwarded (server/debug.py).

The api routes need an admin key when keys are on, as the debug routes do: they show pod
names, addresses and scores. Off by default."""

from __future__ import annotations

import math
import time
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.server.debug import DEBUG_ROUTES, debug_handler
from heimdall_proxy.server.gateway import GATEWAY, Gateway
from heimdall_proxy.server.picks import PickLog

LIVE_PAGE = "/live"
LIVE_API = "/live/api"


def _json(doc: Any) -> web.Response:
    return web.Response(
        body=orjson.dumps(doc),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def _picks(gateway: Gateway) -> PickLog:
    if gateway.picks is None:  # routes exist only with the page on
        raise RequestError(404, "The live page is off.", code="not_found")
    return gateway.picks


def pool_doc(gateway: Gateway) -> dict[str, Any]:
    """What `GET /live/api/pool` answers."""
    picks = _picks(gateway)
    per_pod = picks.per_pod()
    load = gateway.load
    outliers = gateway.outliers
    now = time.monotonic()
    pods = []
    for e in gateway.pool.endpoints():
        m = e.metrics
        age = m.age(now)
        ejected_for, ejections = outliers.ejection(e.name)
        count, prefix = per_pod.get(e.name, (0, None))
        pods.append(
            {
                "name": e.name,
                "address": e.hostport,
                "labels": e.labels,
                "models": sorted(e.models or ()),
                "healthy": e.healthy,
                "scrape_ok": e.scrape_ok,
                "probe_ok": e.probe_ok,
                "in_flight": load.requests.get(e.name, 0),
                "tokens_in_flight": load.tokens.get(e.name, 0),
                "waiting": m.waiting,
                "running": m.running,
                "kv_cache_usage": m.kv_cache_usage,
                "scrape_age": age if math.isfinite(age) else None,
                "ejected": ejected_for > 0.0,
                "ejected_for": ejected_for,
                "ejections": ejections,
                "recent_picks": count,
                "prefix_hit_rate": prefix,
            }
        )
    return {
        "pool": gateway.options.pool_name,
        "time": time.time(),
        "pending": load.pending,
        "draining": gateway.draining,
        "total_picks": picks.count,
        "pods": pods,
        "picks": picks.recent(),
    }


async def live_pool(request: web.Request) -> web.Response:
    return _json(pool_doc(request.app[GATEWAY]))


async def live_trace(request: web.Request) -> web.Response:
    picks = _picks(request.app[GATEWAY])
    try:
        pick_id = int(request.match_info["pick"])
    except ValueError:
        pick_id = -1
    pick = picks.find(pick_id)
    if pick is None or pick.trace is None:
        raise RequestError(404, "No trace kept for that pick.", code="not_found")
    return _json(
        {
            **pick.to_json(),
            "primary_profile": pick.profile,
            "profiles": [p.to_json() for p in pick.trace.profiles],
            "pick": {"name": pick.pod},
            "forwarded": True,
        }
    )


_PAGE: bytes | None = None


def page_html() -> bytes:
    global _PAGE
    if _PAGE is None:
        _PAGE = resources.files("heimdall_proxy.server").joinpath("static/live.html").read_bytes()
    return _PAGE


async def live_page(request: web.Request) -> web.Response:
    return web.Response(
        body=page_html(),
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-store",
            # the page loads nothing from elsewhere and nothing may frame it
            "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'",
        },
    )


def live_routes() -> list[tuple[str, str, Any, bool]]:
    """(method, path, handler, needs an admin key) of the live page."""
    routes: list[tuple[str, str, Any, bool]] = [
        ("GET", LIVE_PAGE, live_page, False),
        ("GET", LIVE_API + "/pool", live_pool, True),
        ("GET", LIVE_API + "/trace/{pick}", live_trace, True),
    ]
    routes += [("POST", LIVE_API + "/decide" + p, debug_handler(p), True) for p in DEBUG_ROUTES]
    return routes
