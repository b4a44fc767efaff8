"""concurrency-detector: saturation from the requests (or prompt tokens) this gateway has in
flight, against a configured capacity per pod. It reacts at once, with no scrape lag, but is
blind to what the engines report: the capacity must match the pods (for vLLM, about
`--max-num-seqs` in requests mode).

Pool saturation is the aggregate in-flight load (plus admitted requests not yet sent) over
the aggregate capacity; in hybrid mode the larger of the request and token ratios. As a
filter it drops pods at or above capacity x (1 + headroom), keeping all when all are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

CONCURRENCY_DETECTOR_TYPE = "concurrency-detector"


class ConcurrencyDetectorParams(PluginParams):
    concurrency_mode: Literal["requests", "tokens", "hybrid"] = "requests"
    max_concurrency: int = Field(default=100, gt=0)
    max_token_concurrency: int = Field(default=1_000_000, gt=0)
    headroom: float = Field(default=0.0, ge=0.0)


@register(CONCURRENCY_DETECTOR_TYPE, ConcurrencyDetectorParams)
class ConcurrencyDetector(BasePlugin[ConcurrencyDetectorParams]):
    type = CONCURRENCY_DETECTOR_TYPE

    def __init__(self, name: str, params: ConcurrencyDetectorParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.load = handle.load
        mode = params.concurrency_mode
        self._by_requests = mode in ("requests", "hybrid")
        self._by_tokens = mode in ("tokens", "hybrid")
        if self._by_tokens:
            self.load.count_tokens = True

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        p = self.params
        load = self.load
        ratio = 0.0
        if self._by_requests:
            inflight = sum(load.requests.get(ep.name, 0) for ep in endpoints) + load.pending
            ratio = inflight / (p.max_concurrency * len(endpoints))
        if self._by_tokens:
            tokens = sum(load.tokens.get(ep.name, 0) for ep in endpoints)
            ratio = max(ratio, tokens / (p.max_token_concurrency * len(endpoints)))
        return ratio

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        p = self.params
        scale = 1.0 + p.headroom
        load = self.load
        kept = [
            ep
            for ep in endpoints
            if not (
                self._by_requests and load.requests.get(ep.name, 0) >= p.max_concurrency * scale
            )
            and not (
                self._by_tokens and load.tokens.get(ep.name, 0) >= p.max_token_concurrency * scale
            )
        ]
        return kept or endpoints
