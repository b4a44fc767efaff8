"""context-length-aware: routes by the request's token count against pods' labelled ranges.
A Filter (when enableFiltering) and a Scorer."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, field_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    extract_prompt_text,
)

CONTEXT_LENGTH_AWARE_TYPE = "context-length-aware"
CONTEXT_LENGTH_LABEL = "mif.moreh.io/context-length-range"

NO_LABEL_SCORE = 0.2
_STATE_KEY = "context-length-aware/tokens"


class ContextLengthParams(PluginParams):
    label: str = CONTEXT_LENGTH_LABEL
    enable_filtering: bool = False
    char_to_token_multiplier: float = Field(default=0.25, gt=0)

    @field_validator("label")
    @classmethod
    def _label(cls, value: str) -> str:
        if not value:
            raise ValueError("label must not be empty")
        return value


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """Parse "min-max[,min-max...]". Raises ValueError on an empty or malformed value, a
    negative bound, or min > max."""
    if not text.strip():
        raise ValueError("empty range")
    ranges = []
    for part in text.split(","):
        bounds = part.strip().split("-")
        if len(bounds) != 2:
            raise ValueError(f"invalid range {part!r} (expected 'min-max')")
        lo, hi = int(bounds[0].strip()), int(bounds[1].strip())
        if lo < 0 or hi < 0:
            raise ValueError(f"negative bound in {part!r}")
        if lo > hi:
            raise ValueError(f"min > max in {part!r}")
        ranges.append((lo, hi))
    return ranges


def range_score(tokens: int, ranges: list[tuple[int, int]]) -> float:
    """Best score over the ranges (seed 002):
    inside a range: 0.7 * widthScore + 0.3 * positionScore, with
        widthScore = 1 / (1 + width / 10000), positionScore = (max - tokens) / width
        (a zero-width range that matches scores 1.0);
    above a range (overflow): 0.25 + 0.25 * max / tokens (a larger max is better);
    below a range: 0.0."""
    best = 0.0
    for lo, hi in ranges:
        if lo <= tokens <= hi:
            width = hi - lo
            if width == 0:
                return 1.0
            score = 0.7 / (1.0 + width / 10000.0) + 0.3 * (hi - tokens) / width
        elif tokens > hi:
            score = 0.25 + 0.25 * hi / tokens
        else:
            score = 0.0
        best = max(best, score)
    return best


def request_chars(request: InferenceRequest) -> int:
    """Characters the seed counts: chat message contents (text parts of list contents too),
    the completions prompt, the Responses API input (not its `instructions`)."""
    if request.api == "responses":
        return len(extract_prompt_text("responses", {"input": request.data.get("input")}))
    return len(request.prompt_text())


@register(CONTEXT_LENGTH_AWARE_TYPE, ContextLengthParams)
class ContextLengthAware(BasePlugin[ContextLengthParams]):
    """Estimates the request's tokens (real token ids when a tokenizer ran, else characters *
    charToTokenMultiplier) and compares them with each pod's `label` ranges.

    Filter (only when enableFiltering): pods without the label pass; labelled pods pass when a
    range contains the estimate; pods whose label does not parse are removed.
    Scorer (always): no label 0.2; unparsable label 0.0; otherwise `range_score`."""

    type = CONTEXT_LENGTH_AWARE_TYPE

    def __init__(self, name: str, params: ContextLengthParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._label = params.label
        self._filtering = params.enable_filtering
        self._mult = params.char_to_token_multiplier
        self._parsed: dict[str, list[tuple[int, int]] | None] = {}

    def tokens(self, state: CycleState, request: InferenceRequest) -> int:
        cached = state.get(_STATE_KEY)
        if cached is None:
            if request.token_ids is not None:
                cached = len(request.token_ids)
            else:
                cached = int(request_chars(request) * self._mult)
            state[_STATE_KEY] = cached
        return int(cached)

    def _ranges(self, value: str) -> list[tuple[int, int]] | None:
        if value not in self._parsed:
            try:
                self._parsed[value] = parse_ranges(value)
            except ValueError:
                self._parsed[value] = None
        return self._parsed[value]

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        if not self._filtering:
            return endpoints
        tokens = self.tokens(state, request)
        out = []
        for e in endpoints:
            value = e.labels.get(self._label)
            if value is None:
                out.append(e)
                continue
            ranges = self._ranges(value)
            if ranges and any(lo <= tokens <= hi for lo, hi in ranges):
                out.append(e)
        return out

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        tokens = self.tokens(state, request)
        out = {}
        for e in endpoints:
            value = e.labels.get(self._label)
            if value is None:
                out[e.name] = NO_LABEL_SCORE
                continue
            ranges = self._ranges(value)
            out[e.name] = 0.0 if ranges is None else range_score(tokens, ranges)
        return out
