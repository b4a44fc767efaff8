"""Instructions one upstream request costs the client that sends it: aiohttp's ClientSession
as the gateway used it, and the gateway's own client (heimdall_proxy/upstream).

Each client sends POST /v1/chat/completions to `bench/harness/fast_upstream.py` (run natively) one
after another on one keep-alive connection, and reads the whole answer. The loop runs under
`valgrind --tool=callgrind` twice, with `--small` and `--large` requests; the difference of the
two totals over the difference of the counts is the cost of one request, start-up excluded.
Counts include the event loop's own work (uvloop) and the parser, not the kernel's.

Other clients are counted when installed (`pip install pyreqwest aiosonic`): not
dependencies, only the comparison that chose the gateway's client (bench/RESULTS.md).

`--stream EVENTS`: the upstream is instead a small aiohttp app here that answers every
request with EVENTS server-sent events 1 ms apart (each arrives on its own), and aiohttp and
the gateway's client read them chunk by chunk as the relay does: the cost of a stream.

Run: `python -m bench.probes.client_cost [--clients aiohttp,heimdall] [--small 200] [--large 1200]
[--stream 100]`
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import cli
from bench.harness.machine import cpu_model, git_head
from bench.harness.pods import fast_upstream_argv
from bench.harness.procs import bench_module, free_ports, start_server, stop_servers, wait_ready

BODY = (
    b'{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
)
PATH = "/v1/chat/completions"
CLIENTS = ("aiohttp", "heimdall", "pyreqwest", "aiosonic")
#: The package each client needs; a client whose package is missing is skipped.
NEEDS = {"aiohttp": "aiohttp", "heimdall": "httptools", "pyreqwest": "pyreqwest",
         "aiosonic": "aiosonic"}  # fmt: skip
COLLECTED = re.compile(r"Collected : (\d+)")


EVENT = (
    b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
)


async def _aiohttp(origin: str, n: int, stream: bool) -> None:
    import aiohttp

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    ) as session:
        timeout = aiohttp.ClientTimeout(sock_connect=5.0, sock_read=600.0)
        headers = {"Content-Type": "application/json"}
        for _ in range(n):
            resp = await session.request(
                "POST", origin + PATH, data=BODY, headers=headers, timeout=timeout
            )
            if stream:
                while await resp.content.readany():
                    pass
            else:
                await resp.read()
            resp.release()


async def _heimdall(origin: str, n: int, stream: bool) -> None:
    from heimdall_proxy.upstream import UpstreamClient, UpstreamTimeouts

    client = UpstreamClient(5.0, 4.0)
    limits = UpstreamTimeouts(read=600.0)
    headers = {"Content-Type": "application/json"}
    for _ in range(n):
        resp = await client.request("POST", origin, PATH, BODY, headers, limits)
        if stream:
            while await resp.readany():
                pass
        else:
            await resp.read()
        resp.release()
    await client.close()


async def _pyreqwest(origin: str, n: int, stream: bool) -> None:
    from pyreqwest.client import ClientBuilder

    async with ClientBuilder().build() as client:
        for _ in range(n):
            request = client.post(origin + PATH).header("Content-Type", "application/json")
            resp = await request.body_bytes(BODY).build().send()
            await resp.bytes()


async def _aiosonic(origin: str, n: int, stream: bool) -> None:
    import aiosonic

    client = aiosonic.HTTPClient()
    for _ in range(n):
        resp = await client.post(
            origin + PATH, data=BODY, headers={"Content-Type": "application/json"}
        )
        await resp.content()


#: The clients whose loops can read a stream chunk by chunk.
STREAMING = ("aiohttp", "heimdall")


async def _serve_stream(port: int, events: int) -> None:
    """The `--stream` upstream: `events` SSE events per request, 1 ms apart."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(events):
            await resp.write(EVENT)
            await asyncio.sleep(0.001)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench-model"}]})

    app = web.Application()
    app.router.add_post(PATH, answer)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


LOOPS = {"aiohttp": _aiohttp, "heimdall": _heimdall, "pyreqwest": _pyreqwest, "aiosonic": _aiosonic}


def count(client: str, origin: str, n: int, stream: bool) -> int:
    """Instructions of a whole process that sends `n` requests with `client`."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
             *bench_module("bench.probes.client_cost"),
             "--loop", client, "--origin", origin, "-n", str(n),
             *(["--stream", "1"] if stream else [])],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    match = COLLECTED.search(proc.stderr)
    if proc.returncode != 0 or match is None:
        raise SystemExit(f"{client}: the loop failed:\n{proc.stdout}{proc.stderr[-2000:]}")
    return int(match.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=1200)
    parser.add_argument("--stream", type=int, default=0, metavar="EVENTS")
    parser.add_argument("--serve-stream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loop", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--origin", help=argparse.SUPPRESS)
    parser.add_argument("-n", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop or args.serve_stream:  # the measured process, or the --stream upstream
        import uvloop

        if args.serve_stream:
            uvloop.run(_serve_stream(args.serve_stream, args.stream))
        else:
            uvloop.run(LOOPS[args.loop](args.origin, args.n, args.stream > 0))
        return 0

    clients = [c for c in args.clients.split(",") if c]
    for c in clients:
        if c not in LOOPS:
            parser.error(f"unknown client {c!r}; known: {', '.join(CLIENTS)}")
    (port,) = free_ports(1)
    workdir = Path(tempfile.mkdtemp(prefix="client-cost-"))
    serve = (
        [
            *bench_module("bench.probes.client_cost"),
            "--serve-stream",
            str(port),
            "--stream",
            str(args.stream),
        ]
        if args.stream
        else fast_upstream_argv(port)
    )
    upstream = start_server("upstream", serve, workdir)
    origin = f"http://127.0.0.1:{port}"
    try:
        wait_ready(upstream, origin + "/v1/models", "models", time.monotonic() + 30)
        what = f"a stream of {args.stream} events" if args.stream else "request"
        print(f"| client | instructions per {what} (callgrind, {args.large} - {args.small}) |")
        print("|---|---:|")
        for c in clients:
            if importlib.util.find_spec(NEEDS[c]) is None:
                print(f"| {c} | not installed |")
                continue
            if args.stream and c not in STREAMING:
                print(f"| {c} | (no streaming loop) |")
                continue
            stream = args.stream > 0
            per = (count(c, origin, args.large, stream) - count(c, origin, args.small, stream)) / (
                args.large - args.small
            )
            print(f"| {c} | {per:,.0f} |", flush=True)
    finally:
        stop_servers([upstream])
    print(
        f"\nMachine: {cpu_model('unknown CPU')}, Python {sys.version.split()[0]}, git {git_head()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
