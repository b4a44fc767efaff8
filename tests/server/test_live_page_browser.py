"""The live page in a real browser: headless Chromium (Debian's `chromium`, which `.ci/run`
installs), driven over its DevTools protocol with aiohttp's websocket client. The page loads
against a gateway in front of simulated pods with no console error, shows the pods, updates
after traffic, and draws a decision (filters as columns, scores as bars).

Set HEIMDALL_LIVE_SCREENSHOT=docs/live-page.png to refresh the documentation's screenshot."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayFactory, PodFactory, make_config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="needs headless Chromium: apt-get install -y chromium chromium-driver "
        "(.ci/run installs it)",
    ),
]

EPP = {
    "plugins": [
        {"type": "by-label", "parameters": {"label": "tier", "validValues": ["gpu"]}},
        {"type": "prefix-cache-scorer"},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "by-label"},
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "queue-scorer", "weight": 2},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}


class DevTools:
    """A minimal DevTools protocol client for one page target."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        #: console errors, uncaught exceptions and failed loads the page reported
        self.errors: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                self.errors.append(
                    "console: " + " ".join(str(a.get("value")) for a in params.get("args", []))
                )
            elif method == "Runtime.exceptionThrown":
                self.errors.append("exception: " + json.dumps(params.get("exceptionDetails")))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                self.errors.append("log: " + params["entry"].get("text", ""))

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[n] = future
        await self.ws.send_str(json.dumps({"id": n, "method": method, "params": params}))
        answer = await asyncio.wait_for(future, 30)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def js(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def until(self, expression: str, within: float = 20.0) -> Any:
        """Poll `expression` until it is truthy (an exception counts as false: the page may
        still be loading); its value."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            try:
                value = await self.js(expression)
            except RuntimeError as exc:
                value, error = None, exc
            else:
                error = None
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"never true in the page: {expression} ({error})")
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.ws.close()


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[DevTools]:
    assert CHROMIUM is not None
    # Chromium's helper processes (zygote, renderer, GPU) outlive a kill of the main one and
    # may still write to the profile as it is removed ("Directory not empty"): the browser
    # runs in a session of its own, whose whole process group goes at the end.
    with tempfile.TemporaryDirectory(prefix="heimdall-chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",  # CI runs as root
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--window-size=1360,1000",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            for _ in range(300):
                if port_file.exists() and port_file.read_text().count("\n") >= 1:
                    break
                await asyncio.sleep(0.1)
            port = port_file.read_text().split("\n")[0].strip()
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = await resp.json()
                page = next(t for t in targets if t["type"] == "page")
                ws = await http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
                tools = DevTools(ws)
                try:
                    await tools.send("Runtime.enable")
                    await tools.send("Log.enable")
                    await tools.send("Page.enable")
                    yield tools
                finally:
                    await tools.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def traffic(url: str, stop: asyncio.Event) -> int:
    """Requests four at a time, three conversations, until `stop`: the number sent."""
    sent = 0
    prompts = [f"Conversation {i}: you are a helpful assistant. " * 60 for i in range(3)]
    async with aiohttp.ClientSession() as http:

        async def one(i: int) -> None:
            body = {
                "model": "sim-model",
                "messages": [{"role": "user", "content": prompts[i % 3]}],
                "max_tokens": 64,
            }
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()

        while not stop.is_set():
            await asyncio.gather(*(one(sent + i) for i in range(4)))
            sent += 4
    return sent


async def test_live_page_in_chromium(start_pod: PodFactory, start_gateway: GatewayFactory) -> None:
    pods = [await start_pod({"tier": "gpu"}, time_scale=0.3) for _ in range(3)]
    pods.append(await start_pod({"tier": "cpu"}, time_scale=0.3))
    gw = await start_gateway(make_config(pods, EPP), live_page=True)
    # one pod ejected, as after failures: the page shows it
    detector = gw.gateway.outliers
    for _ in range(max(1, detector.config.consecutive_failures)):
        detector.failure(pods[2].name)

    async with chromium() as page:
        await page.send("Page.navigate", url=gw.url + "/live")
        await page.until("document.querySelectorAll('#pods .pod').length === 4")
        shown = await page.js(
            "[...document.querySelectorAll('#pods .pod')].map(e => e.dataset.pod)"
        )
        assert sorted(shown) == sorted(p.name for p in pods)
        assert "ejected" in await page.js(
            f"document.querySelector('[data-pod=\"{pods[2].name}\"] .badge').textContent"
        )
        assert await page.js("document.getElementById('pickcount').textContent") == "(0 so far)"

        stop = asyncio.Event()
        sender = asyncio.create_task(traffic(gw.url, stop))
        try:
            # the page polls: the picks and the pods' counts follow the traffic
            await page.until("document.querySelectorAll('#picks tbody tr').length >= 8")
            await page.until(
                "[...document.querySelectorAll('#pods .pod')]"
                ".some(e => e.textContent.includes('in flight') && e.querySelector('.fill'))"
            )
            # a traced pick, drawn: the filters as columns, the scores as bars
            await page.js("document.querySelector('#picks tr.traced').click()")
            await page.until("document.querySelectorAll('#decision .stack').length === 2")
            columns = await page.js(
                "[...document.querySelectorAll('#decision .col h4')].map(e => e.textContent)"
            )
            # the ejected pod is no candidate; the cpu pod is filtered out
            assert columns == ["candidates (3)", "by-label (2)"], columns
            assert await page.js("document.querySelectorAll('#decision .chip.out').length") == 1
            await asyncio.sleep(1.5)  # one more poll under load, for the screenshot
            shot = await page.send(
                "Page.captureScreenshot", format="png", captureBeyondViewport=True
            )
        finally:
            stop.set()
            sent = await sender
        assert sent >= 8
        total = await page.until(
            f"(t => t === '({gw.gateway.picks.count} so far)' && t)"  # type: ignore[union-attr]
            "(document.getElementById('pickcount').textContent)"
        )
        assert total

        # a pasted body explained, nothing forwarded
        before = gw.gateway.picks.count  # type: ignore[union-attr]
        await page.js("document.getElementById('explain').click()")
        await page.until("document.querySelector('#decision h2').textContent.includes('pasted')")
        assert gw.gateway.picks.count == before  # type: ignore[union-attr]
        assert page.errors == []

    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG")
    target = os.environ.get("HEIMDALL_LIVE_SCREENSHOT")
    if target:
        await asyncio.to_thread(Path(target).write_bytes, png)


async def test_live_page_asks_for_the_admin_key(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pod = await start_pod()
    gw = await start_gateway(
        make_config([pod]), live_page=True, api_keys=("user",), admin_api_keys=("admin",)
    )
    async with chromium() as page:
        await page.send("Page.navigate", url=gw.url + "/live")
        await page.until("getComputedStyle(document.getElementById('keybox')).display !== 'none'")
        assert await page.js("document.querySelectorAll('#pods .pod').length") == 0
        await page.js(
            "document.getElementById('key').value = 'user';document.getElementById('keygo').click()"
        )
        await page.until("document.getElementById('err').textContent.includes('not an admin key')")
        await page.js(
            "document.getElementById('key').value = 'admin';"
            "document.getElementById('keygo').click()"
        )
        await page.until("document.querySelectorAll('#pods .pod').length === 1")
        # only the refused polls (401, then 403) were reported, nothing else went wrong
        assert all(" 40" in e for e in page.errors), page.errors
