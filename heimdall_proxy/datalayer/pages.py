"""How the data layer GETs the pods' pages (/metrics, /health, /v1/models): over the relay's
own HTTP/1.1 client (upstream/), its own pool of kept-alive connections, not aiohttp's.

An idle gateway's scraping CPU was mostly per-request overhead: aiohttp's client spends
~150 µs of Python on a GET (URL objects, header multidicts, timers, response and stream
objects) whose 50 kB page the kernel copies in a few microseconds; the upstream client
~50 µs (bench/RESULTS.md, "Scrape cost"). It asks for no compression, which on a pod's
network costs more CPU than the bytes it saves. A page behind TLS with its own certificate
settings (a data source's CA bundle, client certificate or unverified TLS) is read through
the aiohttp session, which takes an SSL context per request."""

from __future__ import annotations

from collections.abc import Mapping
from ssl import SSLContext
from urllib.parse import urlsplit

import aiohttp

from heimdall_proxy.upstream import UpstreamClient, UpstreamTimeouts

#: URLs remembered split (origin, target); beyond this the memory starts over.
MAX_URLS = 16384


class PageReader:
    """GETs whole pages; one per data layer, closed with it."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        #: The session's headers (a pod's API key), sent with every GET.
        self.headers: Mapping[str, str] = dict(session.headers)
        self.client = UpstreamClient(connect_timeout=None)  # each GET's total bounds it
        self._split: dict[str, tuple[str, str]] = {}

    async def get(self, url: str, seconds: float, ssl: SSLContext | bool | None = None) -> bytes:
        """The body of a 200 answer to GET `url` within `seconds`. Raises ValueError
        (another status), OSError (no connection, a connection lost, a malformed answer;
        aiohttp.ClientError too) or TimeoutError."""
        parts = self._split.get(url)
        if parts is None:
            parts = self._split_url(url)
        origin, target = parts
        if origin.startswith("https:") and ssl not in (None, True):
            return await self._via_session(url, seconds, ssl)
        status, body = await self.client.fetch(
            "GET", origin, target, b"", self.headers, UpstreamTimeouts(None, seconds)
        )  # UpstreamError is an OSError; UpstreamTimeout a TimeoutError too
        if status != 200:
            raise ValueError(f"HTTP {status}")
        return body

    def _split_url(self, url: str) -> tuple[str, str]:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) URL: {url!r}")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if len(self._split) >= MAX_URLS:
            self._split.clear()
        split = self._split[url] = (f"{parts.scheme}://{parts.netloc}", target)
        return split

    async def _via_session(self, url: str, seconds: float, ssl: SSLContext | bool) -> bytes:
        async with self.session.get(
            url, timeout=aiohttp.ClientTimeout(total=seconds), ssl=ssl
        ) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            return await resp.read()

    async def close(self) -> None:
        await self.client.close()
