"""Per-decision trace of prefix-cache-affinity-filter at `-v 3`: what the filter saw when it
kept or released a prefix, and when each request started and ended on which pod.

Replicas that share state decide on a view that lags the others' decisions by a round trip
or two, and each learns its own queue price. Comparing, decision by decision, the view a
replica had with the fleet's true state (rebuilt from every replica's start/end lines, the
wall clocks of one host agreeing) tells which of the two makes a pair route worse than one
gateway (bench/replicas.py --trace). One JSON object per line after the word `affinity`;
nothing is formatted unless the level is on."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import orjson

from heimdall_proxy.framework.log import V

log = logging.getLogger(__name__)
LEVEL = V(3)


def enabled() -> bool:
    return log.isEnabledFor(LEVEL)


def emit(event: str, request_id: str, replica: str, **fields: object) -> None:
    """One trace line (callers check enabled() first)."""
    record = {"ev": event, "t": time.time(), "id": request_id, "replica": replica, **fields}
    log.log(LEVEL, "affinity %s", orjson.dumps(record).decode())


def view(
    pods: Iterable[str],
    local: dict[str, float],
    others: dict[str, float],
    price: dict[str, float],
    estimate: dict[str, float],
) -> dict[str, list[float]]:
    """pod -> [own prompt tokens in flight, the others', seconds per token, estimated TTFT]."""
    return {
        p: [local.get(p, 0.0), others.get(p, 0.0), price.get(p, 0.0), estimate.get(p, 0.0)]
        for p in pods
    }
