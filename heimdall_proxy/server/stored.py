"""The stored-response routes (GET / DELETE /v1/responses/{id}, .../input_items), served by
the responses-store plugin when one is configured."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from aiohttp import web

from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.plugins import ResponsesStoreAPI
from heimdall_proxy.server.auth import caller_of
from heimdall_proxy.server.errors import error_response, render
from heimdall_proxy.server.gateway import GATEWAY

log = logging.getLogger(__name__)


def _store(request: web.Request) -> ResponsesStoreAPI | None:
    return request.app[GATEWAY].plugins.responses_store


def _json(doc: Any) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


def _response_not_found(response_id: str, store: ResponsesStoreAPI | None) -> web.Response:
    message = f"Response with id '{response_id}' not found."
    if store is None:
        message += " No responses store is configured (see the responses-store plugin)."
    return error_response(404, message)


def _store_unavailable(exc: Exception) -> web.Response:
    log.warning("responses store failed: %r", exc)
    return error_response(503, "The responses store is unavailable.", code="store_unavailable")


async def get_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    store = _store(request)
    if store is None:
        return _response_not_found(response_id, store)
    try:
        doc = await store.get_response(response_id, caller_of(request))
    except Exception as exc:
        return _store_unavailable(exc)
    return _response_not_found(response_id, store) if doc is None else _json(doc)


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    store = _store(request)
    if store is None:
        return _response_not_found(response_id, store)
    try:
        deleted = await store.delete_response(response_id, caller_of(request))
    except Exception as exc:
        return _store_unavailable(exc)
    if not deleted:
        return _response_not_found(response_id, store)
    return _json({"id": response_id, "object": "response", "deleted": True})


def _page_params(query: Any) -> tuple[int, bool, str | None, str | None]:
    raw = query.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise RequestError(
            400,
            f"Invalid 'limit': {raw!r}; expected an integer between 1 and 100.",
            param="limit",
            code="invalid_value",
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RequestError(
            400,
            f"Invalid 'order': {order!r}; expected 'asc' or 'desc'.",
            param="order",
            code="invalid_value",
        )
    return limit, order == "desc", query.get("after"), query.get("before")


def page_items(
    items: list[dict[str, Any]],
    limit: int,
    descending: bool,
    after: str | None,
    before: str | None,
) -> dict[str, Any]:
    """One page of a cursor-paginated OpenAI list: `after`/`before` are item ids in the
    requested order; `has_more` says whether items remain past the page in the direction
    being read."""
    ordered = items[::-1] if descending else items
    ids = [item.get("id") for item in ordered]
    start, stop = 0, len(ordered)
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise RequestError(
                400, f"No input item with id '{cursor}'.", param=name, code="invalid_value"
            )
    if after is not None:
        start = ids.index(after) + 1
    if before is not None:
        stop = ids.index(before)
    if before is not None and after is None:
        page = ordered[max(start, stop - limit) : stop]
        has_more = stop - limit > start
    else:
        page = ordered[start : min(stop, start + limit)]
        has_more = start + limit < stop
    return {
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": has_more,
    }


async def list_input_items(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    store = _store(request)
    if store is None:
        return _response_not_found(response_id, store)
    try:
        limit, descending, after, before = _page_params(request.query)
    except RequestError as exc:
        return render(exc)
    try:
        items = await store.get_input_items(response_id, caller_of(request))
    except RequestError as exc:  # an earlier turn of the conversation is gone
        return render(exc)
    except Exception as exc:
        return _store_unavailable(exc)
    if items is None:
        return _response_not_found(response_id, store)
    try:
        return _json(page_items(items, limit, descending, after, before))
    except RequestError as exc:
        return render(exc)
