"""responses-store: multi-turn conversation state for the OpenAI Responses API, kept by the
gateway so that any pod can serve any turn."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NamedTuple

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
    TERMINAL_EVENTS,
    BodyCollector,
    FinalResponseParser,
    input_items,
    listed_items,
    turn_items,
)
from heimdall_proxy.plugins.store.params import InMemoryConfig, ResponsesStoreParams
from heimdall_proxy.plugins.store.tiered import TieredBackend

log = logging.getLogger(__name__)

RESPONSES_STORE_TYPE = "responses-store"
PREPARE_DATA_GATE = "prepareDataPlugins"

#: Room for the SSE framing and event fields around the response object of a terminal event.
_EVENT_SLACK = 64 * 1024


#: Response header set when a non-streamed Responses answer was not stored although the
#: request did not say `store: false`: `too-large` (over maxEntryBytes) or `failed` (the
#: store write failed). A streamed answer says it in its terminal event instead: the
#: response object there gets `"store": false`.
STORE_STATUS_HEADER = "x-heimdall-store"

#: Entries a conversation walk reads per backend call; the event loop runs between calls.
WALK_BATCH = 256
#: The decoded turns kept so a walk does not decode every earlier turn on every turn: at
#: most this many bytes of entries (their decoded items take a few times that).
TURN_CACHE_BYTES = 32 << 20


class _Turn(NamedTuple):
    entry: bytes
    owner: str | None
    link: str | None
    items: list[Any]


class BrokenChain(Exception):
    """An earlier response of a conversation is gone (expired, evicted, deleted)."""

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing


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
      self-contained request: `input` becomes the conversation so far (each earlier turn's
      input, then its output items), then the new input; `previous_response_id` is
      removed. The request's own `instructions` are kept and the previous ones are not
      added (as OpenAI does). An unknown id, or a conversation with an earlier turn gone, is
      answered 404 `previous_response_not_found`; a store that cannot be read 503
      `store_unavailable`.
    - ResponseReceived: a stream to store goes through a TerminalHold, which stores the
      final response before its terminal event reaches the client and marks that event
      `"store": false` when it was not stored.
    - ResponseStreaming: collects a JSON body relayed in chunks.
    - ResponseComplete: stores a non-streamed 2xx response (the body) under its own `id`,
      unless the request said `store: false`. An entry over `maxEntryBytes` is not stored,
      nor one whose write failed: a warning is logged and the client still gets its
      response, with `x-heimdall-store: too-large` / `failed`.
    - ResponsesStoreAPI: the server's `GET`/`DELETE /v1/responses/{id}` and
      `GET /v1/responses/{id}/input_items`.

    Entries are `{"prev": <previous response id>, "owner": <caller>, "response": <response
    object>, "input": [<this turn's input items>]}` as JSON ("prev" first, and only when the
    turn continued one), so memory grows with a conversation, not its square; the history
    is assembled by walking the links (an entry without one, as written before entries were
    linked, holds its whole history). The owner is the caller that stored it (its API key's
    digest, the owner header, or "" when the gateway has neither); only it can read,
    continue or delete the entry, a walk through another owner's entry is a broken chain,
    and an entry is never overwritten by another caller's response."""

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
        #: id -> (entry, owner, link, turn items), least recently used first: a decode
        #: cache only; the backend's entry is the truth (a hit needs the same bytes)
        self._turns: OrderedDict[str, _Turn] = OrderedDict()
        self._turn_bytes = 0

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
        turn = self._turns.pop(response_id, None)
        if turn is not None:
            self._turn_bytes -= len(turn.entry)
        return await self.backend.delete(response_id) or staged

    async def get_input_items(self, response_id: str, owner: str) -> list[dict[str, Any]] | None:
        """Raises RequestError 404 when an earlier turn of the conversation is gone."""
        entry = await self._entry(response_id, owner)
        if entry is None:
            return None
        own = entry.get("input") or []
        previous = entry.get("prev")
        if not isinstance(previous, str):
            return listed_items(own)
        try:
            history = await self._history(previous, owner)
        except BrokenChain as broken:
            history = None
            missing = broken.missing
        else:
            missing = previous
        if history is None:
            raise RequestError(
                404,
                f"The input items of response '{response_id}' cannot be listed: an earlier "
                f"response of its conversation, '{missing}', was not found (expired, evicted "
                "or deleted).",
            )
        history.extend(own)
        return listed_items(history)

    # ---- the request ----------------------------------------------------------------------

    async def prepare_data(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        if request.api != "responses":
            return
        previous = request.data.get("previous_response_id")
        if not isinstance(previous, str):
            return
        try:
            history = await self._history(previous, request.caller)
        except BrokenChain as broken:
            raise RequestError(
                404,
                f"Previous response with id '{previous}' cannot be continued: an earlier "
                f"response of its conversation, '{broken.missing}', was not found (expired, "
                "evicted or deleted).",
                code="previous_response_not_found",
                param="previous_response_id",
            ) from None
        except Exception as exc:
            log.warning("responses store read failed for %s: %r", previous, exc)
            raise RequestError(
                503,
                "The responses store is unavailable; cannot load previous_response_id.",
                code="store_unavailable",
                param="previous_response_id",
                headers={"Retry-After": "1"},
            ) from exc
        if history is None:
            raise RequestError(
                404,
                f"Previous response with id '{previous}' not found.",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        data = dict(request.data)
        del data["previous_response_id"]
        history.extend(input_items(request.data.get("input")))
        data["input"] = history
        request.set_data(data)

    async def _history(self, response_id: str, owner: str) -> list[Any] | None:
        """Everything `response_id` read and produced, oldest first (OpenAI's semantics for
        `previous_response_id`: each turn's input, then its output; instructions are not
        part of it), assembled by following the entries' links; None when `owner` has no
        such response. Raises BrokenChain when an earlier turn is gone: a truncated history
        would be a different conversation. Reads WALK_BATCH entries per backend call and lets
        the event loop run between calls, so a long conversation does not stall it."""
        turns: list[list[Any]] = []  # newest first
        rid: str | None = response_id
        while rid is not None:
            if turns:
                await asyncio.sleep(0)
            staged = self._staged.get(rid)
            raws = [staged] if staged is not None else await self.backend.chain(rid, WALK_BATCH)
            if not raws:
                if not turns:
                    return None
                raise BrokenChain(rid)
            for raw in raws:
                assert rid is not None  # the backend followed a link to this entry
                entry_owner, rid, items = self._turn(rid, raw)
                if entry_owner != owner:
                    if not turns:
                        return None
                    raise BrokenChain(rid or "")  # another caller's entry under a reused id
                turns.append(items)
        history: list[Any] = []
        for items in reversed(turns):
            history.extend(items)
        return history

    def _turn(self, rid: str, raw: bytes) -> tuple[str | None, str | None, list[Any]]:
        """(owner, link, turn items) of the entry `raw` stored under `rid`, decoded once.
        The items are shared with every history built from them: read-only."""
        cache = self._turns
        hit = cache.get(rid)
        if hit is not None and (hit.entry is raw or hit.entry == raw):
            cache.move_to_end(rid)
            return hit.owner, hit.link, hit.items
        doc = orjson.loads(raw)
        entry: dict[str, Any] = doc if isinstance(doc, dict) else {}
        owner, link = entry.get("owner", ""), entry.get("prev")
        turn = _Turn(
            raw,
            owner if isinstance(owner, str) else None,
            link if isinstance(link, str) else None,
            turn_items(entry),
        )
        if hit is not None:
            self._turn_bytes -= len(hit.entry)
        cache[rid] = turn
        cache.move_to_end(rid)
        self._turn_bytes += len(raw)
        while self._turn_bytes > TURN_CACHE_BYTES and cache:
            self._turn_bytes -= len(cache.popitem(last=False)[1].entry)
        return turn.owner, turn.link, turn.items

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

    async def response_received(self, ctx: RequestContext) -> None:
        """A stream to store: its chunks go through a TerminalHold, which stores the final
        response before the client gets the terminal event, and marks the event
        `"store": false` when it could not."""
        if not self._wanted(ctx):
            return
        headers = ctx.upstream_response_headers or {}
        if headers.get("Content-Type", "").startswith("text/event-stream"):
            hold = TerminalHold(self, ctx)
            ctx.state[self._parser_key] = hold
            ctx.chunk_filter = hold

    async def response_streaming(self, ctx: RequestContext, chunk: bytes) -> None:
        if not self._wanted(ctx):
            return
        reader: TerminalHold | BodyCollector | None = ctx.state.get(self._parser_key)
        if reader is None:  # a JSON body relayed in chunks (the upstream sent no Content-Length)
            reader = BodyCollector(self.max_entry_bytes)
            ctx.state[self._parser_key] = reader
        if isinstance(reader, BodyCollector):
            reader.feed(chunk)

    async def store_final(self, ctx: RequestContext, response: dict[str, Any]) -> bool:
        """Store a stream's final response now (the terminal event waits for it); whether
        it was stored."""
        staged = self._stage(ctx, response)
        if staged is None:
            return False
        response_id, entry = staged
        try:
            return await self._write(ctx, response_id, entry)
        except Exception as exc:
            self._write_failed(ctx, response_id, exc)
            return False
        finally:
            self._staged.pop(response_id, None)

    async def response_complete(self, ctx: RequestContext) -> None:
        staged: tuple[str, bytes] | None = ctx.state.pop(self._staged_key, None)
        try:
            if staged is None and self._wanted(ctx):
                reader = ctx.state.get(self._parser_key)
                if ctx.response_body is not None:
                    staged = self._stage(ctx, _decode_response(ctx.response_body))
                elif isinstance(reader, BodyCollector) and reader.overflowed:
                    self._too_big(ctx, None, None)
                elif isinstance(reader, BodyCollector) and ctx.error is None:
                    staged = self._stage(ctx, _decode_response(reader.body()))
                if staged is not None:
                    ctx.state[self._staged_key] = staged
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
        """Serialise the entry and make it readable at once; the caller writes it."""
        if response is None or not isinstance(response.get("id"), str):
            return None
        response_id: str = response["id"]
        request = ctx.request
        own_input = request.data.get("input")
        previous: str | None = None
        if request.body_modified:
            original = _decode_object(request.body)
            previous = original.get("previous_response_id")
            if isinstance(previous, str):
                # the request was made self-contained: this turn's own input is the
                # client's, and the entry links to the response it continued
                own_input = original.get("input")
                if response.get("previous_response_id") is None:
                    # the pod never saw the id: record it, as OpenAI shows the chain
                    response = {**response, "previous_response_id": previous}
            else:
                previous = None
        doc: dict[str, Any] = {"prev": previous} if previous is not None else {}
        doc["owner"] = request.caller
        doc["response"] = response
        doc["input"] = input_items(own_input)
        entry = orjson.dumps(doc)  # the link first: backends read it without decoding
        if len(entry) > self.max_entry_bytes:
            self._too_big(ctx, response_id, len(entry))
            return None
        if response_id in self._staged and _owner(self._staged[response_id]) != request.caller:
            return None  # another caller's entry is being written under this id
        self._staged[response_id] = entry
        return response_id, entry

    async def _write(self, ctx: RequestContext, response_id: str, entry: bytes) -> bool:
        existing = await self.backend.get(response_id)
        if existing is not None and _owner(existing) != ctx.request.caller:
            # A pod reused an id another caller's entry has: never overwrite it.
            log.warning(
                "response %s not stored: the id belongs to another caller's entry",
                response_id,
                extra={"request_id": ctx.request.request_id},
            )
            return False
        await self.backend.put(response_id, entry)
        return True

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
        ctx.response_headers[STORE_STATUS_HEADER] = "too-large"  # unless already streaming
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


def _decode_object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _owner(raw: bytes) -> str | None:
    """The owner recorded in a stored entry (None: unreadable)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    owner = doc.get("owner", "") if isinstance(doc, dict) else None
    return owner if isinstance(owner, str) else None


#: A blank line: the end of an SSE event, whatever the line endings.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class TerminalHold:
    """The chunk filter of a stored stream (RequestContext.chunk_filter). Passes complete
    events through as they come and holds back only the bytes of an unfinished one (no
    client can act on half an event). When the terminal event is complete, the plugin stores
    its response before the event is released; when that failed (over maxEntryBytes, the
    write failed, the id is another caller's), the event is re-serialised with
    `"store": false` in its response object, the one in-band place a stream can say it.
    An event over maxEntryBytes + 64 KiB is not held (it could not be stored anyway): it is
    relayed unchanged, and only the log says the response was not stored."""

    __slots__ = ("_ctx", "_done", "_parser", "_store", "_tail")

    def __init__(self, store: ResponsesStore, ctx: RequestContext) -> None:
        self._store = store
        self._ctx = ctx
        self._parser = FinalResponseParser(store.max_entry_bytes + _EVENT_SLACK)
        self._tail = b""
        self._done = False

    async def __call__(self, chunk: bytes) -> bytes:
        if self._done:
            return chunk
        if not chunk:  # the end of the stream
            self._done = True
            return self._tail
        data = self._tail + chunk
        ends = list(_EVENT_END.finditer(data))
        cut = ends[-1].end() if ends else 0
        complete, self._tail = data[:cut], data[cut:]
        if len(self._tail) > self._parser.max_event_bytes:
            self._done = True
            self._store._too_big(self._ctx, None, None)
            return data
        if not complete:
            return b""
        final = self._parser.feed(complete)
        if final is None:
            return complete
        self._done = True
        if await self._store.store_final(self._ctx, final):
            return complete + self._tail
        return _mark_not_stored(complete) + self._tail


def _mark_not_stored(events: bytes) -> bytes:
    """`events` with `"store": false` set in the response object of its terminal event."""
    out: list[bytes] = []
    pos = 0
    for end in _EVENT_END.finditer(events):
        event = events[pos : end.end()]
        pos = end.end()
        lines = event.splitlines()
        data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
        doc: Any = None
        if data and any(t.encode() in event for t in TERMINAL_EVENTS):
            try:
                doc = orjson.loads(b"\n".join(data))
            except orjson.JSONDecodeError:
                doc = None
        response = doc.get("response") if isinstance(doc, dict) else None
        if isinstance(response, dict) and doc.get("type") in TERMINAL_EVENTS:
            doc["response"] = {**response, "store": False}
            head = [line for line in lines if line and not line.startswith(b"data:")]
            event = b"\n".join([*head, b"data: " + orjson.dumps(doc)]) + b"\n\n"
        out.append(event)
    out.append(events[pos:])
    return b"".join(out)
