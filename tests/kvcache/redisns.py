"""A key namespace of its own on the real Redis (127.0.0.1:6379) for one test."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

REDIS_URL = "redis://127.0.0.1:6379/0"


@contextlib.asynccontextmanager
async def redis_namespace() -> AsyncIterator[str]:
    """Yields a fresh key prefix; every key under it is deleted afterwards."""
    prefix = f"hp-test:{uuid.uuid4().hex[:12]}:"
    try:
        yield prefix
    finally:
        client = aioredis.from_url(REDIS_URL)
        try:
            keys = [k async for k in client.scan_iter(match=prefix + "*", count=1000)]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()
