from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.kvcache.redisns import REDIS_URL, redis_namespace

__all__ = ["REDIS_URL"]


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    async with redis_namespace() as prefix:
        yield prefix
