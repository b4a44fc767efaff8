"""Test helpers shared across the suite."""

from __future__ import annotations

from typing import Any

from heimdall_proxy.framework.types import Endpoint, Metrics


def ep(
    name: str,
    labels: dict[str, str] | None = None,
    *,
    host: str | None = None,
    port: int = 8000,
    **metrics: Any,
) -> Endpoint:
    """A pod named `name` (also its host unless `host` is given) with `labels` and the given
    Metrics fields (waiting=3, kv_cache_usage=0.5, ...)."""
    host = host or name
    return Endpoint(
        name=name,
        url=f"http://{host}:{port}",
        host=host,
        port=port,
        labels=labels or {},
        metrics=Metrics(**metrics),
    )
