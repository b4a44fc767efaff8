"""The conductor tests' app: a conductor with the default options behind a test client."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from heimdall_proxy.conductor.app import create_app


@pytest.fixture
async def client(aiohttp_client: Any) -> TestClient[Any, Any]:
    out: TestClient[Any, Any] = await aiohttp_client(create_app())
    return out
