"""vLLM's plain KV-event batches, applied without Python per event (native/_vllm_ingest.c).

A decode step's events are one block each, and in Python each costs ~5.5 us: decoding and
checking it, building its standardized event, resolving it in the engine-hash map, setting
it in the index. Where the extension is built, the event loop's prepare step (ingest
workers off) scans each vLLM payload: a plain batch (see the C module: BlockStored and
BlockRemoved events of the registration's own namespace, one medium, no LoRA or salt)
becomes a `PlainBatch`, which `Conductor.apply` hands to `ConductorIndex.apply_plain`; the
C code applies its events to the same U64Maps with the same arithmetic and stops at the
first one only Python can resolve, from which the Python path goes on. Everything else is
decoded and applied in Python as before. tests/conductor/test_native_ingest.py feeds both
paths the same batches and compares the index, the maps and every counter."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from heimdall_proxy.conductor import tables
from heimdall_proxy.kvcache.events import EventBatch, decode_payload

_vllm_ingest: ModuleType | None
try:  # native/_vllm_ingest.c, built where the machine can
    from heimdall_proxy.native import _vllm_ingest
except ImportError:  # pragma: no cover - the extension is built wherever CI runs
    _vllm_ingest = None


@dataclass(slots=True)
class PlainBatch(EventBatch):
    """A batch the C scan found plain: its payload and its events' medium; `events` stays
    empty until (unless) the Python path has to decode the rest."""

    payload: bytes = b""
    medium: str | None = None
    count: int = 0


def enabled() -> bool:
    """Whether batches are scanned (the extension and U64Map are both built)."""
    return _vllm_ingest is not None and tables.maps_are_native()


def prepare(payload: bytes) -> EventBatch | str:
    """A PlainBatch, or the batch decoded as kvcache.events decodes it (its error message if
    it cannot be)."""
    if _vllm_ingest is not None and type(payload) is bytes and enabled():
        scanned = _vllm_ingest.scan(payload)
        if scanned is not None:
            ts, rank, medium, count = scanned
            return PlainBatch(ts, [], rank, 0, 0, payload, medium, count)
    return decode_payload(payload)


def apply(
    payload: bytes,
    engine_map: tables.BlockMap,
    index: tables.BlockMap,
    bit: int,
    seed: int,
    block_size: int,
    max_keys: int,
    removals: bool,
) -> tuple[int, int, int, int, int, int, int] | None:
    """_vllm_ingest.apply (see its docstring) when both maps are U64Maps and the bit fits;
    None otherwise (the batch is then the Python path's)."""
    if (
        _vllm_ingest is None
        or not tables.is_native(engine_map)
        or not tables.is_native(index)
        or bit >= tables.U64_LIMIT
    ):
        return None
    done: tuple[int, int, int, int, int, int, int] = _vllm_ingest.apply(
        payload, engine_map, index, bit, seed, block_size, max_keys, removals
    )
    return done
