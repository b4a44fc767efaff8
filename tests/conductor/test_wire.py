"""conductor.wire: streams, namespaces and registrations cross to the ingest workers as
tuples and come back as equal objects, one object per distinct tuple (so the index's dicts
find their keys by identity), in a cache that stays bounded."""

from __future__ import annotations

import dataclasses
import pickle

from heimdall_proxy.conductor import model, wire
from heimdall_proxy.conductor.model import Namespace, Registration, Stream
from heimdall_proxy.conductor.wire import (
    Interned,
    namespace_fields,
    registration_fields,
    stream_fields,
)

NS = Namespace("m", 16, "salt", "lora", "tenant")
STREAM = Stream(NS, "pod-a", "cpu", 3)
REG = Registration("tcp://h:1", None, "vLLM", "m", "lora", "tenant", "pod-a", 16, 3, "salt")


def test_tuples_come_back_as_equal_objects_through_pickle() -> None:
    interned = Interned()
    sent = pickle.loads(
        pickle.dumps((stream_fields(STREAM), namespace_fields(NS), registration_fields(REG)))
    )
    assert interned.stream(sent[0]) == STREAM
    assert interned.namespace(sent[1]) == NS
    assert interned.registration(sent[2]) == REG
    # a registration without a replay endpoint and one with it differ
    other = Registration("tcp://h:1", "tcp://h:2", *registration_fields(REG)[2:])
    assert interned.registration(registration_fields(other)) == other != REG


def test_equal_tuples_give_one_object_and_a_stream_shares_its_namespace() -> None:
    interned = Interned()
    a = interned.stream(stream_fields(STREAM))
    b = interned.stream(tuple(stream_fields(STREAM)))  # type: ignore[arg-type]
    assert a is b
    assert a.namespace is interned.namespace(namespace_fields(NS))
    assert a.namespace is REG.namespace()  # one object per namespace, whoever makes it
    assert interned.stream(stream_fields(Stream(NS, "pod-a", "gpu", 3))) is not a


def test_the_caches_stay_bounded() -> None:
    interned = Interned()
    limit = wire.MAX_CACHED
    for i in range(limit + 10):
        ns = interned.namespace(("m", 16, f"salt-{i}", "", "t"))
        assert ns.salt == f"salt-{i}"
        interned.stream(("m", 16, f"salt-{i}", "", "t", "pod", "gpu", 0))
    assert len(model._NAMESPACES) <= model.MAX_NAMESPACES
    assert len(interned._streams) <= limit


def test_every_field_crosses() -> None:
    # a field added to one of the dataclasses must be added to its tuple too (the cached
    # hashes are no constructor fields: they are computed again on the other side)
    for obj, sent in (
        (NS, namespace_fields(NS)),
        (REG, registration_fields(REG)),
        (STREAM, stream_fields(STREAM)),
    ):
        names = [f.name for f in dataclasses.fields(obj) if f.init]
        flat = [
            *(getattr(NS, f.name) for f in dataclasses.fields(NS) if f.init),
            *(getattr(obj, n) for n in names if n != "namespace"),
        ] if obj is STREAM else [getattr(obj, n) for n in names]  # fmt: skip
        assert list(sent) == flat


def test_namespaces_and_streams_hash_once_and_rehash_when_unpickled() -> None:
    """Their hash is computed once, on first use (every event's lookups use it); pickled to
    or from an ingest worker (a Cleared op carries its Stream) they are rebuilt, since a
    str's hash differs between processes."""
    ns = Namespace("m", 16, "salt", "lora", "tenant")
    stream = Stream(ns, "backend", "gpu", 2)
    assert stream._hash == 0  # not computed until used
    assert hash(ns) == hash(("m", 16, "salt", "lora", "tenant"))
    assert hash(stream) == hash((ns, "backend", "gpu", 2)) and stream._hash == hash(stream)
    back = pickle.loads(pickle.dumps(stream))
    assert back._hash == 0 and back.namespace._hash == 0  # rebuilt, not restored
    assert back == stream and hash(back) == hash(stream) and {stream: 1}[back] == 1
    other = dataclasses.replace(ns, salt="other")
    assert other != ns and hash(other) != hash(ns)
    assert "_hash" not in repr(stream)
