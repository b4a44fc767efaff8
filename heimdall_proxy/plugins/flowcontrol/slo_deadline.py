"""slo-deadline-ordering-policy: a flow's requests leave by the deadline their client set for
the first token (received time + `x-llm-d-slo-ttft-ms`), earliest first, so the requests
closest to missing their target go before those with room to spare. Requests without a valid
header sort after every one with it, in arrival order."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import InferenceRequest

SLO_DEADLINE_TYPE = "slo-deadline-ordering-policy"
#: llm-d's TTFT SLO header (milliseconds), and the older name it still accepts.
TTFT_SLO_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
_NO_DEADLINE = float("inf")
#: The most milliseconds a Go time.Duration holds (llm-d treats more as invalid).
_MAX_MS = ((1 << 63) - 1) // 1_000_000


def ttft_slo_ms(headers: Mapping[str, str]) -> int | None:
    """The request's TTFT SLO in whole milliseconds from the first of the headers present
    (llm-d's name before the older one); None when it is empty, not a base-10 integer, or
    negative, as llm-d reads it."""
    for name in TTFT_SLO_HEADERS:
        raw = headers.get(name)
        if raw is not None:
            text = raw.strip()
            digits = text[1:] if text[:1] in "+-" else text
            if not (digits.isascii() and digits.isdigit()):  # no "", "1.5", "1e3"
                return None
            ms = int(text)
            return ms if 0 <= ms <= _MAX_MS else None
    return None


@register(SLO_DEADLINE_TYPE)
class SLODeadlineOrdering(BasePlugin[NoParams]):
    """The deadline counts from when the gateway received the request (before any wait in
    the queue), so time already spent queued is charged against the SLO; equal deadlines,
    and requests without one, keep arrival order."""

    type = SLO_DEADLINE_TYPE

    def order_key(self, arrival: float, deadline: float, request: InferenceRequest) -> float:
        ms = ttft_slo_ms(request.headers)
        return _NO_DEADLINE if ms is None else request.received_at + ms / 1000.0
