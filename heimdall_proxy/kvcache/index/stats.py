"""Counters of the KV-block index and its event feed."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class KVCacheStats:
    """Counters of the index and its event feed (enableMetrics logs them)."""

    batches: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    orphan_events: int = 0
    unknown_removals: int = 0
    block_size_mismatch: int = 0
    unknown_medium: int = 0
    unknown_events: int = 0
    #: malformed events skipped (their batch's other events applied)
    invalid_events: int = 0
    decode_errors: int = 0
    gaps: int = 0
    missed_batches: int = 0
    replayed_batches: int = 0
    publisher_restarts: int = 0
    #: batches whose sequence number was seen already (SubscriberOptions.duplicate_window)
    duplicate_batches: int = 0
    #: batches on the shared socket whose topic named no followed pod (kvcache.topics)
    unattributed_batches: int = 0
    evicted_keys: int = 0
    speculative_blocks: int = 0
    lookups: int = 0
    lookup_hits: int = 0
    #: Blocks of the prompts looked up, and those some candidate held (the longest run).
    lookup_keys: int = 0
    lookup_key_hits: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
