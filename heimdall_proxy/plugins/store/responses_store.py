"""responses-store: multi-turn conversation state for the OpenAI Responses API, kept by the
gateway so that any pod can serve any turn."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint, InferenceRequest, RequestContext
from heimdall_proxy.plugins.store.backends import InMemoryBackend, StoreBackend
from heimdall_proxy.plugins.store.conversation import (
    BodyCollector,
    FinalResponseParser,
    continued_input,
    input_items,
    listed_items,
)
from heimdall_proxy.plugins.store.params import InMemoryConfig, ResponsesStoreParams
from heimdall_proxy.plugins.store.tiered import TieredBackend

log = logging.getLogger(__name__)

RESPONSES_STORE_TYPE = "responses-store"
PREPARE_DATA_GATE = "prepareDataPlugins"

#: Room for the SSE framing and event fields around the response object of a terminal event.
_EVENT_SLACK = 64 * 1024


#: Response header set when a non-streamed Responses answer could not be stored.
STORE_STATUS_HEADER = "x-heimdall-store"


def make_backend(params: ResponsesStoreParams) -> StoreBackend:
    """The backend the parameters select: tieredConfig wins over inMemoryConfig; none at all
    is an in-memory backend with a 24h ttl."""
    cfg = params.store_config
    if cfg is not None and cfg.tiered_config is not None:
        return TieredBackend(cfg.tiered_config)
    mem = cfg.in_memory_config if cfg is not None else None
    mem = mem or InMemoryConfig()  # ttl 24h
    return InMemoryBackend(
        mem.ttl, mem.max_entries, mem.max_entry_bytes, max_total_bytes=mem.max_total_bytes
    )


@register(RESPONSES_STORE_TYPE, ResponsesStoreParams, feature_gate=PREPARE_DATA_GATE)
class ResponsesStore(BasePlugin[ResponsesStoreParams]):
    """Keeps every Responses API response the gateway relays, so `previous_response_id` works
    whichever pod served the earlier turns.

    - PrepareData: a `POST /v1/responses` with `previous_response_id` is rewritten into a
      self-contained request: `input` becomes the previous response's input, its output
      items, then the new input; `previous_response_id` is removed. The request's own
      `instructions` are kept and the previous ones are not added (as OpenAI does). An
      unknown id is answered 404 `previous_response_not_found`; a store that cannot be read
      503 `store_unavailable`.
    - ResponseStreaming: follows an SSE stream to its `response.completed` (or
      `.incomplete` / `.failed`) event and takes the final response object from it.
    - ResponseComplete: stores a 2xx response (non-streamed: the body) under its own `id`,
      with the (expanded) input it answered, unless the request said `store: false`. An
      entry over `maxEntryBytes` is not stored (a warning is logged; the client still gets
      its response). A stored stream is readable from the moment its final event was seen.
    - ResponsesStoreAPI: the server's `GET`/`DELETE /v1/responses/{id}` and
      `GET /v1/responses/{id}/input_items`.

    Entries are `{"owner": <caller>, "response": <response object>, "input": [<input
    items>]}` as JSON, so each is self-contained: evicting or deleting an earlier turn does
    not break later ones. The owner is the caller that stored it (its API key's digest, the
    owner header, or "" when the gateway has neither); only it can read, continue or delete
    the entry, and an entry is never overwritten by another caller's response."""

    type = RESPONSES_STORE_TYPE

    def __init__(
        self,
        name: str,
        params: ResponsesStoreParams,
        handle: PluginHandle,
        backend: StoreBackend | None = None,
    ) -> None:
        super().__init__(name, params, handle)
        self.backend = backend if backend is not None else make_backend(params)
        self.max_entry_bytes = self.backend.max_entry_bytes
        self._parser_key = f"{name}:stream"
        self._staged_key = f"{name}:staged"
        self.write_failures = 0
        #: entries staged but not yet written by the backend: read-your-writes for a client
        #: that continues a stream the moment it saw the final event
        self._staged: dict[str, bytes] = {}

    def inherit(self, previous: ResponsesStore, gone: frozenset[str]) -> str | None:
        """A reload keeps an in-memory store's entries (else every conversation in it ends:
        `previous_response_id` would be answered 404), under the new limits. A tiered store
        needs nothing: its entries are read back from Redis / MongoDB."""
        old, new = previous.backend, self.backend
        if not isinstance(old, InMemoryBackend) or not isinstance(new, InMemoryBackend):
            return "entries not carried over: only an in-memory store's are (tiered: read back)"
        old.set_limits(new)
        self.backend = old
        self._staged = previous._staged
        self.write_failures = previous.write_failures
        return None

    async def start(self) -> None:
        await self.backend.start()

    async def stop(self) -> None:
        await self.backend.stop()

    # ---- reading ------------------------------------------------------------------------

    async def _raw_entry(self, response_id: str) -> dict[str, Any] | None:
        raw = self._staged.get(response_id)
        if raw is None:
            raw = await self.backend.get(response_id)
        if raw is None:
            return None
        entry = orjson.loads(raw)
        return entry if isinstance(entry, dict) else None

    async def _entry(self, response_id: str, owner: str) -> dict[str, Any] | None:
        """The entry, when `owner` owns it (an entry of another owner does not exist for
        them: the same 404, so ids cannot be probed)."""
        entry = await self._raw_entry(response_id)
        if entry is None or entry.get("owner", "") != owner:
            return None
        return entry

    async def get_response(self, response_id: str, owner: str) -> dict[str, Any] | None:
        entry = await self._entry(response_id, owner)
        response = entry.get("response") if entry is not None else None
        return response if isinstance(response, dict) else None

    async def delete_response(self, response_id: str, owner: str) -> bool:
        if await self._entry(response_id, owner) is None:
            return False
        staged = self._staged.pop(response_id, None) is not None
        return await self.backend.delete(response_id) or staged

    async def get_input_items(self, response_id: str, owner: str) -> list[dict[str, Any]] | None:
        entry = await self._entry(response_id, owner)
        if entry is None:
            return None
        return listed_items(entry.get("input") or [])

    # ---- the request ----------------------------------------------------------------------

    async def prepare_data(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        if request.api != "responses":
            return
        previous = request.data.get("previous_response_id")
        if not isinstance(previous, str):
            return
        try:
            entry = await self._entry(previous, request.caller)
        except Exception as exc:
            log.warning("responses store read failed for %s: %r", previous, exc)
            raise RequestError(
                503,
                "The responses store is unavailable; cannot load previous_response_id.",
                code="store_unavailable",
                param="previous_response_id",
                headers={"Retry-After": "1"},
            ) from exc
        if entry is None:
            raise RequestError(
                404,
                f"Previous response with id '{previous}' not found.",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        data = dict(request.data)
        del data["previous_response_id"]
        data["input"] = continued_input(entry, request.data.get("input"))
        request.set_data(data)

    # ---- the response ---------------------------------------------------------------------

    @staticmethod
    def _wanted(ctx: RequestContext) -> bool:
        status = ctx.status
        return (
            ctx.request.api == "responses"
            and status is not None
            and 200 <= status < 300
            and ctx.request.data.get("store") is not False
        )

    async def response_streaming(self, ctx: RequestContext, chunk: bytes) -> None:
        if not self._wanted(ctx):
            return
        reader: FinalResponseParser | BodyCollector | None = ctx.state.get(self._parser_key)
        if reader is None:
            headers = ctx.upstream_response_headers or {}
            if headers.get("Content-Type", "").startswith("text/event-stream"):
                reader = FinalResponseParser(self.max_entry_bytes + _EVENT_SLACK)
            else:  # a JSON body relayed in chunks (the upstream sent no Content-Length)
                reader = BodyCollector(self.max_entry_bytes)
            ctx.state[self._parser_key] = reader
        if isinstance(reader, FinalResponseParser):
            final = reader.feed(chunk)
            if final is not None:
                self._stage(ctx, final)
        else:
            reader.feed(chunk)

    async def response_complete(self, ctx: RequestContext) -> None:
        staged: tuple[str, bytes] | None = ctx.state.pop(self._staged_key, None)
        try:
            if staged is None and self._wanted(ctx):
                reader = ctx.state.get(self._parser_key)
                if ctx.response_body is not None:
                    staged = self._stage(ctx, _decode_response(ctx.response_body))
                elif reader is not None and reader.overflowed:
                    self._too_big(ctx, None, None)
                elif isinstance(reader, BodyCollector) and ctx.error is None:
                    staged = self._stage(ctx, _decode_response(reader.body()))
            if staged is not None:
                response_id, entry = staged
                try:
                    await self._write(ctx, response_id, entry)
                except Exception as exc:
                    self._write_failed(ctx, response_id, exc)
        finally:
            if staged is not None:
                self._staged.pop(staged[0], None)
            ctx.state.pop(self._staged_key, None)

    def _stage(
        self, ctx: RequestContext, response: dict[str, Any] | None
    ) -> tuple[str, bytes] | None:
        """Serialise the entry and make it readable at once; response_complete writes it."""
        if response is None or not isinstance(response.get("id"), str):
            return None
        response_id: str = response["id"]
        request = ctx.request
        if request.body_modified and response.get("previous_response_id") is None:
            # The pod never saw the id (the request was made self-contained): record the one
            # the client sent, so GET /v1/responses/{id} shows the chain as OpenAI does.
            previous = _original_previous_id(request.body)
            if previous is not None:
                response = {**response, "previous_response_id": previous}
        entry = orjson.dumps(
            {
                "owner": request.caller,
                "response": response,
                "input": input_items(request.data.get("input")),
            }
        )
        if len(entry) > self.max_entry_bytes:
            self._too_big(ctx, response_id, len(entry))
            return None
        staged = (response_id, entry)
        if response_id in self._staged and _owner(self._staged[response_id]) != request.caller:
            return None  # another caller's entry is being written under this id
        self._staged[response_id] = entry
        ctx.state[self._staged_key] = staged
        return staged

    async def _write(self, ctx: RequestContext, response_id: str, entry: bytes) -> None:
        existing = await self.backend.get(response_id)
        if existing is not None and _owner(existing) != ctx.request.caller:
            # A pod reused an id another caller's entry has: never overwrite it.
            log.warning(
                "response %s not stored: the id belongs to another caller's entry",
                response_id,
                extra={"request_id": ctx.request.request_id},
            )
            return
        await self.backend.put(response_id, entry)

    def _write_failed(self, ctx: RequestContext, response_id: str, exc: Exception) -> None:
        """Never silent: logged, counted, and (for an answer not yet sent, i.e. not streamed)
        told to the client in `x-heimdall-store: failed`: a later previous_response_id
        naming this response would get a 404."""
        self.write_failures += 1
        ctx.response_headers[STORE_STATUS_HEADER] = "failed"
        log.error(
            "response %s not stored: the store write failed: %r",
            response_id,
            exc,
            extra={"request_id": ctx.request.request_id},
        )

    def collect_metrics(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "heimdall_responses_store_write_failures",
            "Responses the store failed to write (the client was told when not streamed).",
            labels=["plugin"],
        )
        family.add_metric([self.name], self.write_failures)
        yield family

    def _too_big(self, ctx: RequestContext, response_id: str | None, size: int | None) -> None:
        what = f"{size} bytes" if size is not None else "the response alone is"
        log.warning(
            "response %s not stored: %s over maxEntryBytes (%d)",
            response_id or "(streamed)",
            what,
            self.max_entry_bytes,
            extra={"request_id": ctx.request.request_id},
        )


def _decode_response(body: bytes) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and doc.get("object", "response") == "response" else None


def _original_previous_id(body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    previous = doc.get("previous_response_id") if isinstance(doc, dict) else None
    return previous if isinstance(previous, str) else None


def _owner(raw: bytes) -> str | None:
    """The owner recorded in a stored entry (None: unreadable)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    owner = doc.get("owner", "") if isinstance(doc, dict) else None
    return owner if isinstance(owner, str) else None
