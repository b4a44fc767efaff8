"""Streams, namespaces and registrations as plain tuples, to cross to and from the ingest
worker processes (conductor.prepare).

They are frozen slotted dataclasses, which pickle through Python-level code (a Registration
through dataclasses' `__getstate__` / `__setstate__`, a Namespace or Stream through its
`__reduce__`, which rebuilds it so that its hash is this process's): for vLLM's one-event
batches that cost more CPU than the blocks' keys, on both sides of the pipe. A tuple of str
and int fields pickles in C. Each side turns tuples back into objects through a cache, so
equal tuples give the same object (for the index, the same Namespace object as its key: a
dict probe by identity, without the dataclass's `__eq__`)."""

from __future__ import annotations

from heimdall_proxy.conductor.model import Namespace, Registration, Stream, namespace_of

#: (model, block_size, salt, lora, tenant)
NamespaceFields = tuple[str, int, str, str, str]
#: namespace fields + (backend_id, medium, dp_rank)
StreamFields = tuple[str, int, str, str, str, str, str, int]
#: Registration's fields, in order
RegistrationFields = tuple[str, str | None, str, str, str, str, str, int, int, str]

#: Entries a cache holds at most (cache_salt namespaces are per request: without a bound
#: a cache would grow for ever); past it, it starts over.
MAX_CACHED = 4096


def namespace_fields(ns: Namespace) -> NamespaceFields:
    return (ns.model, ns.block_size, ns.salt, ns.lora, ns.tenant)


def stream_fields(stream: Stream) -> StreamFields:
    ns = stream.namespace
    return (
        ns.model, ns.block_size, ns.salt, ns.lora, ns.tenant,
        stream.backend_id, stream.medium, stream.dp_rank,
    )  # fmt: skip


def registration_fields(reg: Registration) -> RegistrationFields:
    return (
        reg.endpoint, reg.replay_endpoint, reg.type, reg.model, reg.lora_name, reg.tenant_id,
        reg.instance_id, reg.block_size, reg.dp_rank, reg.additional_salt,
    )  # fmt: skip


class Interned:
    """Tuples back into objects, one object per distinct tuple (bounded)."""

    __slots__ = ("_registrations", "_streams")

    def __init__(self) -> None:
        self._streams: dict[StreamFields, Stream] = {}
        self._registrations: dict[RegistrationFields, Registration] = {}

    @staticmethod
    def namespace(fields: NamespaceFields) -> Namespace:
        return namespace_of(*fields)

    def stream(self, fields: StreamFields) -> Stream:
        stream = self._streams.get(fields)
        if stream is None:
            if len(self._streams) >= MAX_CACHED:
                self._streams.clear()
            ns = self.namespace(fields[:5])
            stream = self._streams[fields] = Stream(ns, fields[5], fields[6], fields[7])
        return stream

    def registration(self, fields: RegistrationFields) -> Registration:
        reg = self._registrations.get(fields)
        if reg is None:
            if len(self._registrations) >= MAX_CACHED:
                self._registrations.clear()
            reg = self._registrations[fields] = Registration(*fields)
        return reg
