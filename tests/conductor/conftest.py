"""The conductor tests' app (a conductor with the default options behind a test client), and
`map_kind`: a test that uses it runs once with the native maps and once with DictMap."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from heimdall_proxy.conductor import tables
from heimdall_proxy.conductor.app import create_app


@pytest.fixture(params=["native", "dict"])
def map_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The index and the engine maps on U64Map, then on DictMap (as without the extension)."""
    if request.param == "native":
        assert tables.NATIVE, "native/_u64map.c is not built: pip install -e . builds it"
    else:
        monkeypatch.setattr(tables, "_U64Map", None)
    kind: str = request.param
    return kind


@pytest.fixture
async def client(aiohttp_client: Any) -> TestClient[Any, Any]:
    out: TestClient[Any, Any] = await aiohttp_client(create_app())
    return out
