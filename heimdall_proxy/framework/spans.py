"""The contract between the request path and OpenTelemetry tracing, for the parts that live
in framework/ (the scheduler's profile loop). The tracing itself is in observability/tracing.py and
is optional: when it is off no RequestSpans is on the CycleState, and the scheduler pays one
dict lookup per cycle."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

#: CycleState key of the request's RequestSpans, present only when tracing is on.
SPANS_KEY = "heimdall/spans"


class RequestSpans(Protocol):
    def phase(self, name: str, **attributes: Any) -> AbstractContextManager[Any]:
        """A child span of the request's span, open for the `with` block; an exception
        leaving the block is recorded on it."""
        ...
