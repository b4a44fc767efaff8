"""The simplest honest aiohttp reverse proxy: the baseline the gateway is compared against.

One shared ``ClientSession`` (unlimited connector, no decompression, no cookie jar), no routing,
no per-request logging. For every request it reads the body, forwards method, path + query, body
and end-to-end headers to one upstream, and relays status, end-to-end headers and body. Responses
with a ``Content-Length`` are buffered; others (chunked, e.g. SSE streams) are relayed chunk by
chunk as they arrive.

Run: ``python -m bench.harness.bare_forwarder --port 8002 --upstream http://127.0.0.1:8001``
"""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import uvloop
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from bench.harness import cli

# RFC 9110 section 7.6.1 connection-specific headers, plus Host (set from the upstream URL) and
# Content-Length (recomputed by aiohttp for the body it actually sends).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
DROP_REQUEST = HOP_BY_HOP | {"host", "content-length"}
DROP_RESPONSE = HOP_BY_HOP | {"content-length"}

# aiohttp's client would otherwise invent these when the caller did not send them; a proxy
# must not (an Accept-Encoding the client never sent would get it a compressed body).
SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")

SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)


def _filter(headers: CIMultiDictProxy[str], drop: frozenset[str]) -> CIMultiDict[str]:
    extra: set[str] = set()
    for value in headers.getall("Connection", ()):
        extra.update(token.strip().lower() for token in value.split(","))
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower not in drop and lower not in extra:
            out.add(name, value)
    return out


def make_app(upstream: str) -> web.Application:
    base = upstream.rstrip("/")
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def on_startup(app: web.Application) -> None:
        app[SESSION_KEY] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=SKIP_AUTO_HEADERS,
        )

    async def on_cleanup(app: web.Application) -> None:
        await app[SESSION_KEY].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        url = URL(base + request.raw_path, encoded=True)
        headers = _filter(request.headers, DROP_REQUEST)
        try:
            async with app[SESSION_KEY].request(
                request.method, url, data=body, headers=headers, allow_redirects=False
            ) as resp:
                out_headers = _filter(resp.headers, DROP_RESPONSE)
                if resp.content_length is not None or request.method == "HEAD":
                    data = await resp.read()
                    return web.Response(
                        status=resp.status, reason=resp.reason, headers=out_headers, body=data
                    )
                stream = web.StreamResponse(
                    status=resp.status, reason=resp.reason, headers=out_headers
                )
                await stream.prepare(request)
                async for chunk in resp.content.iter_any():
                    await stream.write(chunk)
                await stream.write_eof()
                return stream
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.Response(status=502, text=f"upstream error: {type(exc).__name__}: {exc}\n")

    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def serve(host: str, port: int, upstream: str) -> None:
    runner = web.AppRunner(make_app(upstream), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"bare_forwarder listening on http://{host}:{port} -> {upstream}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8001")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.host, args.port, args.upstream))


if __name__ == "__main__":
    main()
