"""At -v 4 every plugin that ran is named in a JSON log line per request (as in seed 001)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from heimdall_proxy.observability.logs import setup_logging
from tests.conftest import GatewayFactory, PodFactory, make_config


@pytest.fixture
def restore_logging() -> Iterator[None]:
    logger = logging.getLogger("heimdall_proxy")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.mark.usefixtures("restore_logging")
async def test_v4_names_every_plugin(
    start_pod: PodFactory, start_gateway: GatewayFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    epp = {
        "plugins": [
            {"type": "by-label", "parameters": {"label": "zone", "allowsNoLabel": True}},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "weighted-random-picker"},
        ]
    }
    pod = await start_pod()
    gw = await start_gateway(make_config([pod], epp))
    setup_logging(4, "json")
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/completions", json=body) as r:
            assert r.status == 200
    lines = [
        orjson.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")
    ]
    ran = [
        (d["msg"], d.get("filter") or d.get("scorer") or d.get("picker"))
        for d in lines
        if d["msg"].startswith("Running")
    ]
    assert ran == [
        ("Running filter", "by-label"),
        ("Running scorer", "queue-scorer"),
        ("Running scorer", "kv-cache-utilization-scorer"),
        ("Running picker", "weighted-random-picker"),
    ]
    assert all(d["level"] == "v4" for d in lines if d["msg"].startswith("Running"))
    assert len({d["request_id"] for d in lines if d["msg"].startswith("Running")}) == 1


@pytest.mark.usefixtures("restore_logging")
async def test_default_verbosity_is_quiet(
    start_pod: PodFactory, start_gateway: GatewayFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    pod = await start_pod()
    gw = await start_gateway(make_config([pod]))
    setup_logging(0, "json")
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x"}
        ) as r:
            assert r.status == 200
    assert "Running scorer" not in capsys.readouterr().err


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(("tty", "json_lines"), [(False, True), (True, False)])
def test_default_log_format_follows_the_terminal(
    tty: bool, json_lines: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    setup_logging(0, None)
    logging.getLogger("heimdall_proxy.test").warning("hello")
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("{") is json_lines
    assert "hello" in line
