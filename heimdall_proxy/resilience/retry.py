"""When a failed attempt goes to the next pod: the statuses worth it, the retry budget and the
backoff.

- A pod that answers 429, 500, 502, 503 or 504 before any byte reached the client is
  replaced by the next-best candidate, as a connect or read failure is; other statuses
  (4xx: the request itself) pass through. The last candidate's answer is relayed as is.
- Budget (Envoy's retry budget): retries in flight at most `ratio` of the requests in
  flight, but at least `min_concurrency`, so a fleet-wide outage cannot double the load.
- Backoff: full jitter over 25 ms x 2^(n-1), at most 250 ms; a `Retry-After` the pod sent
  is honoured up to 1 s (the next pod is another pod, so no longer)."""

from __future__ import annotations

import random
from collections.abc import Mapping

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

BASE_BACKOFF = 0.025
MAX_BACKOFF = 0.25
MAX_RETRY_AFTER = 1.0


class RetryBudget:
    __slots__ = ("in_flight", "min_concurrency", "ratio", "retries")

    def __init__(self, ratio: float = 0.2, min_concurrency: int = 3) -> None:
        self.ratio = ratio
        self.min_concurrency = min_concurrency
        self.in_flight = 0
        self.retries = 0

    def allows(self) -> bool:
        return self.retries < max(self.min_concurrency, self.ratio * self.in_flight)


def backoff(retry: int, headers: Mapping[str, str] | None = None) -> float:
    """Seconds to wait before retry number `retry` (1-based)."""
    value = headers.get("Retry-After") if headers is not None else None
    if value is not None:
        try:
            return max(0.0, min(MAX_RETRY_AFTER, float(value)))
        except ValueError:
            pass  # an HTTP date: fall back to jitter
    return random.uniform(0.0, min(MAX_BACKOFF, BASE_BACKOFF * 2 ** (retry - 1)))


def failure_reason(error: str | None) -> str:
    """A bounded label for why an attempt failed: its status, or the stage (connect, read)."""
    if not error:
        return "unknown"
    if error.startswith("status "):
        return error[7:]
    return error.split(" ", 1)[0]
