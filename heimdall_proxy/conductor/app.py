"""The conductor's HTTP API (aiohttp): /register, /unregister, /query, /query_by_hash,
/health, /metrics. Bodies are parsed by conductor.api; errors are
`{"error": {"message", "type", "code"}}` with a 4xx, and no request can take the service
down (a handler's unexpected failure is a logged 500)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, Metric, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from heimdall_proxy.conductor.api import (
    ApiError,
    as_object,
    parse_query,
    parse_register,
    parse_unregister,
)
from heimdall_proxy.conductor.index import STANDARD_MEDIA, InstanceHit
from heimdall_proxy.conductor.model import Registration
from heimdall_proxy.conductor.service import Conductor, ServiceOptions

log = logging.getLogger(__name__)

CONDUCTOR = web.AppKey("conductor", Conductor)
QUERY_LATENCY = web.AppKey("query_latency", Histogram)
#: Bodies larger than this are refused with 413 before they are read.
MAX_BODY_BYTES = 64 << 20
#: The feed counters exported as conductor_feed_total{kind}.
FEED_KINDS = (
    "batches", "gaps", "replayed_batches", "missed_batches", "duplicate_batches",
    "publisher_restarts", "decode_errors", "unknown_events", "invalid_events", "orphan_events",
    "unknown_removals", "block_size_mismatch", "evicted_keys",
)  # fmt: skip
_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(doc), status=status, content_type="application/json", headers=headers
    )


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _json(exc.body(), exc.status)
    except web.HTTPRequestEntityTooLarge:
        return _json(
            ApiError(413, f"the body exceeds {MAX_BODY_BYTES} bytes", "body_too_large").body(),
            413,
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        doc = ApiError(exc.status, exc.reason, exc.reason.lower().replace(" ", "_")).body()
        return _json(doc, exc.status)
    except Exception:
        log.exception("conductor: %s %s failed", request.method, request.path)
        doc = {"error": {"message": "internal error", "type": "server_error", "code": "internal"}}
        return _json(doc, 500)


async def _body(request: web.Request) -> dict[str, Any]:
    return _parse(await request.read())


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", "invalid_json") from exc
    as_object(doc)
    return doc  # type: ignore[no-any-return]  # a dict, checked


async def register(request: web.Request) -> web.Response:
    reg = parse_register(await _body(request))
    request.app[CONDUCTOR].register(reg)
    return _json({"status": "registered successfully", "instance_id": reg.instance_id})


async def unregister(request: web.Request) -> web.Response:
    req = parse_unregister(await _body(request))
    removed = request.app[CONDUCTOR].unregister(req)
    if not removed:
        raise ApiError(
            404, f"no publisher registered as instance {req.instance_id!r}, tenant "
            f"{req.tenant_id!r}, dp_rank {req.dp_rank}", "unknown_instance",
        )  # fmt: skip
    return _json({"status": "unregistered successfully", "removed_instances": removed})


def _answers(
    kept: list[tuple[str, list[int]]],
    hits: dict[str, InstanceHit],
    media: list[tuple[str, str]],
    block_size: int,
) -> dict[str, dict[str, Any]]:
    """Each kept instance's answer, in `kept`'s order; `media`: (tracked name, answered
    name) of each medium. One loop with the common case (one DP rank) spelt out: this runs
    for every instance in scope on every query."""
    out: dict[str, dict[str, Any]] = {}
    for instance, ranks in kept:
        hit = hits.get(instance)
        if hit is None:
            doc: dict[str, Any] = {"longest_matched": 0}
            for _, label in media:
                doc[label] = 0
            doc["DP"] = {str(r): 0 for r in ranks}
        else:
            held = hit.media
            doc = {"longest_matched": hit.longest * block_size}
            for medium, label in media:
                doc[label] = held.get(medium, 0) * block_size
            dp = hit.dp
            if len(ranks) == 1:
                doc["DP"] = {str(ranks[0]): dp.get(ranks[0], 0) * block_size}
            else:
                doc["DP"] = {str(r): dp.get(r, 0) * block_size for r in ranks}
        out[instance] = doc
    return out


def _query(by_hash: bool) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        conductor = request.app[CONDUCTOR]
        opts = conductor.options
        raw = await request.read()
        # without JSON booleans in the body, the ids are checked by one array conversion
        no_bools = b"true" not in raw and b"false" not in raw
        query = parse_query(
            _parse(raw), by_hash, opts.max_query_tokens, opts.max_query_blocks, no_bools
        )
        t0 = time.perf_counter()
        scope, hits = conductor.query(query)
        ns = query.namespace
        if query.instance_id is not None and not scope:
            raise ApiError(
                404, f"instance {query.instance_id!r} is not registered under tenant "
                f"{ns.tenant!r}", "unknown_instance",
            )  # fmt: skip
        # the longest matches first; scope is sorted by instance and the sort is stable, so
        # ties stay in instance order
        longest = {i: hit.longest for i, hit in hits.items()}
        ranked = sorted(scope, key=lambda s: -longest.get(s[0], 0))
        kept = ranked[: opts.max_instances]
        tracked = conductor.index.media_of(ns)
        names = (*STANDARD_MEDIA, *(m for m in tracked if m not in STANDARD_MEDIA))
        media = [(m, m.upper()) for m in names]
        answer = _answers(kept, hits, media, ns.block_size)
        request.app[QUERY_LATENCY].observe(time.perf_counter() - t0)
        headers = {}
        if len(ranked) > len(kept):
            headers["x-conductor-omitted-instances"] = str(len(ranked) - len(kept))
        return _json({ns.tenant: answer}, headers=headers)

    return handle


async def health(request: web.Request) -> web.Response:
    conductor = request.app[CONDUCTOR]
    return _json({"status": "ok", "publishers": len(conductor.registrations)})


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[_REGISTRY]
    return web.Response(body=generate_latest(registry), content_type="text/plain")


class _Collector:
    """The conductor's counters and gauges, read at scrape time."""

    def __init__(self, conductor: Conductor) -> None:
        self.conductor = conductor

    def collect(self) -> Iterator[Metric]:
        c = self.conductor
        events = CounterMetricFamily(
            "conductor_events", "KV events applied, by type (rate: events/s).", labels=["type"]
        )
        for kind in ("stored", "removed", "cleared"):
            events.add_metric([kind], getattr(c.events, kind))
        yield events
        yield CounterMetricFamily(
            "conductor_blocks_stored",
            "Blocks indexed by stored events.",
            value=c.stats.stored_blocks,
        )
        yield CounterMetricFamily(
            "conductor_blocks_removed", "Blocks removed by events.", value=c.stats.removed_blocks
        )
        feed = CounterMetricFamily(
            "conductor_feed", "Event feed counters (gaps, replays, restarts, ...).", labels=["kind"]
        )
        for kind in FEED_KINDS:
            feed.add_metric([kind], getattr(c.stats, kind))
        for kind, value in (
            ("stream_gaps", c.order.gaps),
            ("stream_missed_events", c.order.missed),
            ("duplicate_events", c.order.duplicates),
            ("stream_restarts", c.order.restarts),
        ):
            feed.add_metric([kind], value)
        yield feed
        blocks = GaugeMetricFamily("conductor_blocks", "Sequence hashes held, by medium.",
                                   labels=["medium"])  # fmt: skip
        for medium, n in sorted(c.index.blocks_per_medium().items()):
            blocks.add_metric([medium], n)
        yield blocks
        lag = GaugeMetricFamily(
            "conductor_event_lag_seconds",
            "Age of each publisher's latest batch when it was applied.",
            labels=["publisher"],
        )
        for key, seconds in sorted(c.lag.items()):
            lag.add_metric([key], seconds)
        yield lag
        yield GaugeMetricFamily(
            "conductor_publishers", "Registered publishers.", value=len(c.registrations)
        )


_REGISTRY = web.AppKey("registry", CollectorRegistry)


def create_app(
    options: ServiceOptions | None = None, publishers: list[Registration] | None = None
) -> web.Application:
    """The conductor app; its subscriptions start and stop with it. `publishers` are
    registered at start-up (the config file's list)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    conductor = Conductor(options)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Collector(conductor))
    app[CONDUCTOR] = conductor
    app[_REGISTRY] = registry
    app[QUERY_LATENCY] = Histogram(
        "conductor_query_duration_seconds",
        "Time to answer /query and /query_by_hash (hashing included, parsing excluded).",
        buckets=_LATENCY_BUCKETS,
        registry=registry,
    )

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await conductor.start()
        for reg in publishers or ():
            conductor.register(reg)
        yield
        await conductor.stop()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/register", register)
    app.router.add_post("/unregister", unregister)
    app.router.add_post("/query", _query(False))
    app.router.add_post("/query_by_hash", _query(True))
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app
