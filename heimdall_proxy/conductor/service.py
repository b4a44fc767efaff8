"""The conductor's state: the registered publishers, their ZMQ subscriptions, the index.

Subscriptions reuse the gateway's kvcache.subscriber (one SUB socket per publisher, batches
applied in publisher order, gaps replayed from the registered `replay_endpoint`, a sequence
that starts over read as a restart, duplicates within `duplicate_window` dropped); this
module is its endpoint source: every registration is one "pod" named by its key,
`instance|tenant|dp_rank`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from heimdall_proxy.conductor.api import Query, Unregister
from heimdall_proxy.conductor.index import ConductorIndex, InstanceHit
from heimdall_proxy.conductor.model import (
    MOONCAKE,
    SGLANG,
    STANDARD,
    VLLM,
    Cleared,
    Registration,
    Removed,
    Stored,
)
from heimdall_proxy.conductor.mooncake import (
    MooncakeBatch,
    MooncakeState,
    decode_mooncake,
    from_mooncake,
)
from heimdall_proxy.conductor.native_ingest import PlainBatch
from heimdall_proxy.conductor.normalise import StreamCache, from_vllm, stream_of
from heimdall_proxy.conductor.prepare import (
    REMOVED,
    STORED,
    ConductorPreparer,
    PreparedBatch,
    ints,
)
from heimdall_proxy.conductor.standard import (
    DUPLICATE,
    RESTART,
    StandardBatch,
    StreamOrder,
    decode_standard,
    to_event,
)
from heimdall_proxy.conductor.tables import warn_if_dict
from heimdall_proxy.conductor.wire import Interned
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.kvcache.events import EventBatch, decode_payload
from heimdall_proxy.kvcache.hashing import STANDARD_HASH_SEED, LazyBlockKeys, warn_if_python
from heimdall_proxy.kvcache.index.stats import KVCacheStats
from heimdall_proxy.kvcache.index.walk import WALK_CHUNK
from heimdall_proxy.kvcache.subscriber import KVEventsSubscriber, Prepare, SubscriberOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    hash_seed: int = STANDARD_HASH_SEED
    #: token ids a /query may send, hashes a /query_by_hash may send
    max_query_tokens: int = 1 << 20
    max_query_blocks: int = 1 << 16
    #: instances answered per tenant at most (the longest matches first)
    max_instances: int = 256
    #: hashes per namespace and medium before the oldest are evicted
    max_blocks_per_medium: int = 50_000_000
    replay_timeout: float = 1.0
    duplicate_window: int = 1024
    #: subscriber workers (each publisher always goes to the same one)
    concurrency: int = 2
    #: worker processes decoding, rehashing and resolving vLLM's batches, owning their
    #: publishers' engine-hash maps (conductor.prepare); 0: on the event loop
    ingest_workers: int = 0


@dataclass(slots=True)
class EventCounts:
    stored: int = 0
    removed: int = 0
    cleared: int = 0


class Conductor:
    """Registrations, subscriptions and the index of one conductor process."""

    def __init__(self, options: ServiceOptions | None = None) -> None:
        self.options = options or ServiceOptions()
        self.stats = KVCacheStats()
        self.index = ConductorIndex(
            self.options.hash_seed, self.options.max_blocks_per_medium, self.stats
        )
        self.registrations: dict[str, Registration] = {}
        self._endpoints: dict[str, Endpoint] = {}
        self._endpoints_view: Mapping[str, Endpoint] = MappingProxyType(self._endpoints)
        #: every key ever registered -> its registration, until its blocks are forgotten
        self._owners: dict[str, Registration] = {}
        self.events = EventCounts()
        #: publisher key -> seconds between the engine stamping its latest batch and now
        self.lag: dict[str, float] = {}
        #: event_id order per stream of the standardized publishers
        self.order = StreamOrder()
        sub_options = SubscriberOptions(
            concurrency=self.options.concurrency,
            discover_pods=True,
            replay_timeout=self.options.replay_timeout,
            reconcile_interval=5.0,
            duplicate_window=self.options.duplicate_window,
            topic_filter="",
            # publishers register by key and their topics are free (any engine, any format):
            # a socket each tells them apart, where one shared socket would need the topic to
            shared_socket=False,
        )
        #: per publisher, bumped whenever its blocks are dropped (conductor.prepare orders
        #: the workers' engine-hash maps by it)
        self._generations: dict[str, int] = {}
        self.preparer = ConductorPreparer(
            self.registrations.get,
            self._generation_of,
            self.options.hash_seed,
            self.index.max_keys,
            self.options.ingest_workers,
            self._maps_lost,
        )
        #: vLLM's (and SGLang's) publishers; standardized ones have their own decoder
        self.subscriber = KVEventsSubscriber(
            sub_options, _Publishers(self, (VLLM, SGLANG)), self.apply, self.forget,
            self.stats, replay_address=self._replay_of, prepare_for=self.preparer.prepare,
        )  # fmt: skip
        self.standard_subscriber = KVEventsSubscriber(
            sub_options, _Publishers(self, (STANDARD,)), self.apply, self.forget, self.stats,
            prepare=_decoder(decode_standard), replay_address=self._replay_of,
        )  # fmt: skip
        self.mooncake_subscriber = KVEventsSubscriber(
            sub_options, _Publishers(self, (MOONCAKE,)), self.apply, self.forget, self.stats,
            prepare=_decoder(decode_mooncake), replay_address=self._replay_of,
        )  # fmt: skip
        #: per Mooncake publisher, its keys' blocks and media
        self._mooncake: dict[str, MooncakeState] = {}
        #: per vLLM publisher, the streams of its current registration (normalise)
        self._streams: dict[str, StreamCache] = {}
        #: the ingest workers' streams and namespaces, from their tuples (conductor.wire)
        self._wire = Interned()

    def _generation_of(self, key: str) -> int:
        return self._generations.get(key, 0)

    def _maps_lost(self) -> None:
        """The engine-hash maps moved between the ingest workers and the event loop (a
        worker died, or the pool came back): what they resolved cannot be removed any
        more, so every vLLM publisher's blocks are dropped, as for a restart."""
        for reg in list(self.registrations.values()):
            if reg.type in (VLLM, SGLANG):
                self._drop(reg)

    def _replay_of(self, key: str, endpoint: str) -> str | None:
        reg = self.registrations.get(key)
        return reg.replay_endpoint if reg is not None else None

    # ---- lifecycle -------------------------------------------------------------------------

    def _subscribers(self) -> tuple[KVEventsSubscriber, ...]:
        return (self.subscriber, self.standard_subscriber, self.mooncake_subscriber)

    async def start(self) -> None:
        warn_if_python(log)
        warn_if_dict(log)
        self.preparer.start()
        for sub in self._subscribers():
            await sub.start()

    async def stop(self) -> None:
        for sub in self._subscribers():
            await sub.stop()
        await self.preparer.close()

    def _reconcile(self) -> None:
        for sub in self._subscribers():
            sub.reconcile()

    # ---- registration ----------------------------------------------------------------------

    @property
    def endpoints(self) -> Mapping[str, Endpoint]:
        """Publisher key -> the endpoint its subscription follows, for every registered
        publisher: a read-only view (register / unregister change it)."""
        return self._endpoints_view

    def register(self, reg: Registration) -> bool:
        """Follow `reg`'s publisher; False when exactly this registration exists already.
        A key registered again with other fields is replaced (its blocks are dropped)."""
        current = self.registrations.get(reg.key)
        if current == reg:
            return False
        if current is not None:
            self._drop(current)
        self.registrations[reg.key] = reg
        self._owners[reg.key] = reg
        self._endpoints[reg.key] = Endpoint(
            name=reg.key, url="", host="", port=0, kv_events=reg.endpoint
        )
        self._reconcile()
        log.info("registered %s publisher %s at %s", reg.type, reg.key, reg.endpoint)
        return True

    def unregister(self, req: Unregister) -> list[str]:
        """Stop following the publisher and drop its blocks; the keys removed."""
        reg = self.registrations.pop(req.key, None)
        if reg is None:
            return []
        registered = {
            "type": reg.type.lower(),
            "modelname": reg.model,
            "lora_name": reg.lora_name,
            "block_size": reg.block_size,
        }
        for name, value in req.described:
            given = value.lower() if name == "type" else value
            if registered[name] != given:
                log.warning(
                    "unregister %s: %s %r does not match the registration's %r (the "
                    "publisher is identified by instance_id, tenant_id and dp_rank)",
                    req.key,
                    name,
                    value,
                    registered[name],
                )
        del self._endpoints[req.key]
        self._reconcile()
        self._drop(reg)
        self.lag.pop(req.key, None)
        log.info("unregistered publisher %s", req.key)
        return [req.key]

    def _drop(self, reg: Registration) -> None:
        self.index.drop_source(reg.tenant_id, (reg.instance_id, reg.dp_rank), reg.key)
        self._generations[reg.key] = self._generations.get(reg.key, 0) + 1
        self.preparer.forget(reg.key)
        self._streams.pop(reg.key, None)
        self.order.forget(reg.key)
        self._mooncake.pop(reg.key, None)

    # ---- events ----------------------------------------------------------------------------

    async def apply(self, key: str, batch: EventBatch) -> None:
        """One decoded batch of publisher `key` (the subscriber calls it in order)."""
        reg = self.registrations.get(key)
        if reg is None:
            return  # unregistered while the batch was queued
        if type(batch) is PreparedBatch:
            while batch.generation != self._generations.get(key, 0):
                # prepared before the publisher's blocks were dropped: prepare it as if
                # it came after (conductor.prepare)
                again = await self.preparer.again(key, batch.payload)
                if type(again) is not PreparedBatch:
                    return  # cannot be: it was decoded before
                batch = again
                reg = self.registrations.get(key)
                if reg is None:
                    return  # unregistered meanwhile
            if batch.ops is not None:
                if batch.ts > 0:
                    self.lag[key] = max(0.0, time.time() - batch.ts)
                self._apply_resolved(key, batch)
                return
        elif isinstance(batch, StandardBatch):
            self._apply_standard(key, reg, batch)
            return
        if batch.ts > 0:
            self.lag[key] = max(0.0, time.time() - batch.ts)
        if type(batch) is PlainBatch:
            self._apply_plain(key, reg, batch)
        elif isinstance(batch, MooncakeBatch):
            state = self._mooncake.setdefault(key, MooncakeState())
            events, invalid = from_mooncake(reg, batch.raw, state)
            self.stats.invalid_events += invalid
            self.apply_events(key, events)
        else:
            streams = self._streams.get(key)
            if streams is None:
                streams = self._streams[key] = {}
            self.apply_events(key, from_vllm(reg, batch, streams=streams))

    def _apply_plain(self, key: str, reg: Registration, batch: PlainBatch) -> None:
        """A batch the C scan found plain (conductor.native_ingest): its events applied in C
        from the first, as far as that goes; the rest decoded and applied here."""
        streams = self._streams.get(key)
        if streams is None:
            streams = self._streams[key] = {}
        stream = stream_of(reg, streams, batch.medium)
        done, stored, removed = self.index.apply_plain(key, stream, batch.payload)
        self.events.stored += stored
        self.events.removed += removed
        if done < batch.count:
            rest = decode_payload(batch.payload)
            if isinstance(rest, str):  # pragma: no cover - the scan found it well-formed
                return
            rest.events = rest.events[done:]
            self.apply_events(key, from_vllm(reg, rest, streams=streams))

    def _apply_resolved(self, key: str, batch: PreparedBatch) -> None:
        """A batch an ingest worker resolved (conductor.prepare): only the index's bits are
        left to set."""
        index = self.index
        counts = self.events
        wire = self._wire
        for op in batch.ops or ():
            kind = op[0]
            if kind == STORED:
                counts.stored += 1
                if op[2] is not None:
                    index.add(wire.stream(op[1]), ints(op[2]))
            elif kind == REMOVED:
                counts.removed += 1
                targets = [(wire.namespace(ns), ints(keys)) for ns, keys in op[2]]
                index.remove(wire.stream(op[1]), targets)
            else:
                counts.cleared += 1
                index.cleared(key, op[1])
        stats = self.stats
        stats.orphan_events += batch.orphans
        stats.block_size_mismatch += batch.mismatches
        stats.unknown_removals += batch.unknown_removals
        stats.invalid_events += batch.bad_events

    def _apply_standard(self, key: str, reg: Registration, batch: StandardBatch) -> None:
        events = []
        newest = 0
        for raw in batch.raw:
            try:
                ev, order = to_event(reg, raw)
            except ValueError as exc:
                self.stats.invalid_events += 1
                log.debug("skipped a malformed standardized event of %s: %s", key, exc)
                continue
            verdict = self.order.admit(key, order, ev.event_id)
            if verdict == DUPLICATE:
                continue
            if verdict == RESTART:  # the stream started over: its blocks are void
                self.index.cleared(key, Cleared(ev.stream, ev.event_id))
            ts = raw.get("timestamp")
            if type(ts) is int:
                newest = max(newest, ts)
            events.append(ev)
        if newest:
            self.lag[key] = max(0.0, time.time() - newest / 1000)
        # removals name the publisher's own hashes when it sends token ids (not the standard)
        self.apply_events(key, events, engine_hashes=self.index.has_engine_map(key))

    def apply_events(
        self, key: str, events: Iterable[Stored | Removed | Cleared], engine_hashes: bool = True
    ) -> None:
        """Apply standardized events of publisher `key`; `engine_hashes`: its removals name
        the engine's own hashes."""
        index = self.index
        counts = self.events
        for ev in events:
            try:
                if type(ev) is Stored:
                    counts.stored += 1
                    index.stored(key, ev)
                elif type(ev) is Removed:
                    counts.removed += 1
                    index.removed(key, ev, engine_hashes)
                elif type(ev) is Cleared:
                    counts.cleared += 1
                    index.cleared(key, ev)
            except (ValueError, OverflowError, TypeError) as exc:
                self.stats.invalid_events += 1  # one malformed event; the others apply
                log.debug("skipped a malformed KV event of %s: %r", key, exc)

    async def forget(self, key: str) -> None:
        """The subscriber's verdict that `key`'s blocks are void (its publisher restarted,
        or it is no longer followed)."""
        reg = self._owners.get(key)
        if reg is None:
            return
        self._drop(reg)
        if key not in self.registrations:
            del self._owners[key]

    # ---- queries ---------------------------------------------------------------------------

    def instances(self, query: Query) -> list[tuple[str, list[int]]]:
        """(instance, its registered DP ranks) in the query's scope: registered under its
        tenant for its model and block size (or holding blocks of that namespace), or the
        one instance it names."""
        ns = query.namespace
        holding = self.index.sources_of(ns)  # a store's events may name other models
        ranks: dict[str, list[int]] = {}
        for reg in self.registrations.values():
            if reg.tenant_id != ns.tenant:
                continue
            if query.instance_id is not None and reg.instance_id != query.instance_id:
                continue
            if (
                query.instance_id is None
                and (reg.model != ns.model or reg.block_size != ns.block_size)
                and (reg.instance_id, reg.dp_rank) not in holding
            ):
                continue
            ranks.setdefault(reg.instance_id, []).append(reg.dp_rank)
        return sorted((i, sorted(r)) for i, r in ranks.items())

    def query(self, query: Query) -> tuple[list[tuple[str, list[int]]], dict[str, InstanceHit]]:
        """The instances in scope and what they hold of the query's blocks."""
        scope = self.instances(query)
        ns = query.namespace
        if not scope:
            return scope, {}
        keys: Sequence[int] = (
            query.values
            if query.by_hash
            # hashed a walk's chunk at a time: the walk stops where the last instance in
            # scope drops out, and the rest of the prompt is never hashed
            else LazyBlockKeys(query.values, ns.block_size, self.options.hash_seed, WALK_CHUNK)
        )
        return scope, self.index.query(ns, keys, [i for i, _ in scope])


class _Publishers:
    """One subscriber's endpoint source: the registered publishers of its wire format."""

    def __init__(self, conductor: Conductor, types: tuple[str, ...]) -> None:
        self._conductor = conductor
        self._types = types

    def _mine(self, key: str) -> bool:
        reg = self._conductor.registrations.get(key)
        return reg is not None and reg.type in self._types

    def endpoints(self) -> list[Endpoint]:
        return [e for k, e in self._conductor.endpoints.items() if self._mine(k)]

    def get(self, name: str) -> Endpoint | None:
        return self._conductor.endpoints.get(name) if self._mine(name) else None


def _decoder(decode: Callable[[bytes], EventBatch]) -> Prepare:
    """A subscriber's Prepare from a one-message decoder (an undecodable message becomes
    its error message, as kvcache.events.decode_payload makes it)."""

    async def prepare(payloads: list[bytes]) -> list[EventBatch | str]:
        return [decode_payload(payload, decode) for payload in payloads]

    return prepare
