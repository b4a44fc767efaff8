"""Multimodal encoder-cache match information shared through the CycleState.

mm-embeddings-cache-producer finds which candidate pods likely still hold the encoder
output of a request's images, audio or video, and leaves it under `match_key(its name)`;
mm-embeddings-cache-scorer reads it by the producer's name, without importing it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MM_EMBEDDINGS_PRODUCER_TYPE = "mm-embeddings-cache-producer"


@dataclass(frozen=True, slots=True)
class MMItem:
    """One distinct media item of a request: its content hash and modality."""

    hash: str
    modality: str
    size: int = 1


@dataclass(frozen=True, slots=True)
class EncoderCacheMatchInfo:
    """What the producer leaves on the CycleState: the request's distinct items, and per
    candidate pod those it likely holds."""

    request_items: tuple[MMItem, ...]
    matched: Mapping[str, tuple[MMItem, ...]]

    def ratio(self, pod: str) -> float:
        total = sum(i.size for i in self.request_items)
        if total <= 0:
            return 0.0
        return sum(i.size for i in self.matched.get(pod, ())) / total


def match_key(producer_name: str) -> str:
    """Where the producer `producer_name` leaves its EncoderCacheMatchInfo."""
    return f"{MM_EMBEDDINGS_PRODUCER_TYPE}/{producer_name}"
