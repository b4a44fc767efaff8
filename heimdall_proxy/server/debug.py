"""The debug route (`--debug-routes`): why would this request go to that pod?

`POST /debug/route/v1/chat/completions` (or `/v1/completions`, `/v1/responses`,
`/v1/messages`) takes the body the real route takes and runs the same director: parsing,
candidates, prepare-data and producers (a prefix match is computed, a stored conversation
is read), then a scheduling cycle that records what each profile's filters kept, every
scorer's raw and weighted score per pod, the totals, the pick and the ranking. Nothing is
forwarded and no pre-request hook runs, so no pod, counter or affinity index sees the
request. Errors are the real route's.

Off by default: it shows pod names and scores to whoever can reach the gateway."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.trace import ScheduleTrace
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.server.auth import caller_of
from heimdall_proxy.server.errors import render
from heimdall_proxy.server.gateway import GATEWAY

DEBUG_PREFIX = "/debug/route"
DEBUG_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages")


def _pod(e: Endpoint) -> dict[str, Any]:
    return {"name": e.name, "address": f"{e.host}:{e.port}"}


def debug_handler(path: str) -> Any:
    async def handler(request: web.Request) -> web.Response:
        gateway = request.app[GATEWAY]
        trace = ScheduleTrace()
        try:
            body = await request.read()
            decision = await gateway.director.decide(
                path, body, request.headers, trace, caller_of(request)
            )
        except RequestError as exc:
            return render(exc, path)
        result = decision.result
        doc = {
            "model": decision.request.model,
            "api": decision.request.api,
            "primary_profile": result.primary_profile,
            "profiles": [p.to_json() for p in trace.profiles],
            "pick": _pod(result.primary.targets[0]),
            "fallback_order": [e.name for e in result.fallback_order()],
            "forwarded": False,
        }
        return web.Response(body=orjson.dumps(doc), content_type="application/json")

    handler.__name__ = f"debug_route_{path.rsplit('/', 1)[-1]}"
    return handler
