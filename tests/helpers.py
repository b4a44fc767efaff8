"""Test helpers shared across the suite."""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
import time
from pathlib import Path
from typing import Any

import aiohttp
import xxhash
from aiohttp.test_utils import TestClient

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


# ---- the Hugging Face Hub client's cache ----------------------------------------------------

#: The snapshot commit hub_cache files its copies under.
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(
    root: Path, repo: str, tokenizer: Path, revision: str = "main", name: str = "tokenizer.json"
) -> Path:
    """The Hub client's cache layout for one file of `repo` at `revision`: `tokenizer`
    copied in as `name`; the copy's path."""
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / revision).write_text(COMMIT)
    shutil.copy(tokenizer, snap / name)
    return snap / name


# ---- block hashes -------------------------------------------------------------------------


def reference_seq_hashes(
    tokens: list[int], bs: int, seed: int, parent: int | None = None
) -> list[int]:
    """The standard's rolling hash transcribed plainly (one struct.pack per token, one loop
    step per block), to check kvcache.hashing's optimised code against:
    seq[i] = XXH3(seq[i-1]_le || local[i]_le, S); seq[0] = local[0] at the root."""
    out = []
    prev = parent
    for i in range(len(tokens) // bs):
        chunk = b"".join(struct.pack("<I", t) for t in tokens[i * bs : (i + 1) * bs])
        local = xxhash.xxh3_64_intdigest(chunk, seed)
        if prev is None:
            prev = local
        else:
            prev = xxhash.xxh3_64_intdigest(
                struct.pack("<Q", prev) + struct.pack("<Q", local), seed
            )
        out.append(prev)
    return out


# ---- the conductor's HTTP API (tests/conductor) ------------------------------------------

#: The conductor tests' block size and prompt (8 blocks), asked for as model "deepseek".
BS = 4
TOKENS = list(range(100, 132))


def q(tokens: list[int] = TOKENS, **extra: Any) -> dict[str, Any]:
    """A /query body for `tokens` of model "deepseek" in blocks of BS."""
    return {"model": "deepseek", "token_ids": tokens, "block_size": BS, **extra}


async def post(client: TestClient[Any, Any], path: str, body: Any, status: int = 200) -> Any:
    """POST `body` as JSON; the answer's JSON, asserting its status."""
    resp = await client.post(path, json=body)
    doc = await resp.json()
    assert resp.status == status, doc
    return doc


async def hits(client: TestClient[Any, Any], body: dict[str, Any], path: str = "/query") -> Any:
    return await post(client, path, body)


async def eventually_query(
    client: TestClient[Any, Any], body: dict[str, Any], instance: str, tokens: int
) -> None:
    """Query until `instance` matches `tokens` (events arrive asynchronously)."""
    for _ in range(250):
        doc = await hits(client, body)
        if doc[body.get("tenant_id", "default")].get(instance, {}).get("longest_matched") == tokens:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{instance} never matched {tokens} tokens: {doc}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_http(url: str, within: float = 20.0) -> None:
    """Wait until `url` answers below 500 (a subprocess's server is up)."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, f"{url} never answered"
            await asyncio.sleep(0.1)


def builtins_with(**extra: Any) -> Any:
    """A registry of every built-in plugin plus test plugins, type name -> class."""
    from heimdall_proxy.plugins.builtins import load_builtin_plugins

    reg = load_builtin_plugins()
    for type_name, cls in extra.items():
        reg.register(type_name)(cls)
    return reg
