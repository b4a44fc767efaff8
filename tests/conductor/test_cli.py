"""`heimdall-proxy conductor` as a process: flags, the config file, refusal of a bad one."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from heimdall_proxy.cli.main import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
async def test_the_subcommand_serves_with_its_config_and_seed(tmp_path: Path) -> None:
    cfg = tmp_path / "conductor.yaml"
    cfg.write_text(
        "maxInstances: 8\npublishers:\n"
        "- {endpoint: 'tcp://127.0.0.1:1', type: vLLM, modelname: m, instance_id: i0,"
        " block_size: 4, dp_rank: 0}\n"
    )
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heimdall_proxy", "conductor", "--host", "127.0.0.1",
        "--port", str(port), "--hash-seed", "7", "--config", str(cfg),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert f"http://127.0.0.1:{port}".encode() in line
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"{base}/health") as resp:
                        health = await resp.json()
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            assert health == {"status": "ok", "publishers": 1}
            body = {"model": "m", "block_size": 4, "token_ids": list(range(8))}
            async with http.post(f"{base}/query", json=body) as resp:
                doc = await resp.json()
            assert doc["default"]["i0"]["longest_matched"] == 0
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("maxInstances: 0\n", "maxInstances"),
        ("bogus: 1\n", "bogus"),
        ("publishers:\n- {type: vLLM}\n", "publishers[0]: missing required field 'endpoint'"),
    ],
)
def test_a_bad_config_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert main(["conductor", "--config", str(cfg), "--port", "1"]) == 1
    assert expected in capsys.readouterr().err


def test_a_bad_seed_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conductor", "--hash-seed", "-1", "--port", "1"]) == 1
    assert "--hash-seed" in capsys.readouterr().err


def test_the_seed_flag_is_checked_by_the_config_files_field() -> None:
    from heimdall_proxy.conductor.settings import ConductorSettings, ConductorSettingsError

    settings = ConductorSettings(hashSeed=3)
    assert settings.options().hash_seed == 3
    assert settings.options((1 << 64) - 1).hash_seed == (1 << 64) - 1
    with pytest.raises(ConductorSettingsError, match="--hash-seed"):
        settings.options(1 << 64)
