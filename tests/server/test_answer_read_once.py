"""Each answer is read once, by the relay: its first-chunk time, its events and its usage are
on the attempt's context for every hook that asks, and no plugin times or scans the answer
again."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp

import heimdall_proxy
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import RequestContext
from heimdall_proxy.server.app import create_app
from tests.conftest import PodFactory, make_config
from tests.helpers import builtins_with

SEEN: list[dict[str, Any]] = []


class Reader(BasePlugin[NoParams]):
    """Writes down what the context says of the answer, chunk by chunk and at its end."""

    type = "test-answer-reader"

    async def response_streaming(self, ctx: RequestContext, chunk: bytes) -> None:
        SEEN.append({"chunk": ctx.events, "seen": ctx.events_seen, "first": ctx.first_chunk_at})

    async def response_complete(self, ctx: RequestContext) -> None:
        SEEN.append(
            {
                "started": ctx.started_at,
                "first": ctx.first_chunk_at,
                "last": ctx.last_chunk_at,
                "seen": ctx.events_seen,
                "usage": (ctx.prompt_tokens, ctx.output_tokens),
            }
        )


async def test_hooks_read_the_answer_from_the_context(
    start_pod: PodFactory, aiohttp_server: Any
) -> None:
    pod = await start_pod()
    config = make_config([pod], {"plugins": [{"type": "test-answer-reader"}]})
    app = create_app(config, ServerOptions(), builtins_with(**{"test-answer-reader": Reader}))
    server = await aiohttp_server(app)
    url = str(server.make_url("/v1/completions"))
    body = {"model": "sim-model", "prompt": "hello there", "max_tokens": 6}
    async with aiohttp.ClientSession() as http:
        SEEN.clear()
        async with http.post(url, json={**body, "stream": True}) as resp:
            text = await resp.text()
        assert '"usage"' not in text  # the gateway asked for usage; the client did not
        *chunks, end = SEEN
        assert chunks and all(c["first"] == chunks[0]["first"] > 0.0 for c in chunks)
        assert [c["seen"] for c in chunks] == sorted(c["seen"] for c in chunks)
        assert chunks[-1]["seen"] == sum(c["chunk"] for c in chunks)
        assert 0.0 < end["started"] <= end["first"] <= end["last"]
        prompt, output = end["usage"]
        assert output == 6 and prompt is not None and prompt > 0  # the pod's usage event

        SEEN.clear()
        async with http.post(url, json=body) as resp:
            assert resp.status == 200
        [end] = SEEN  # a whole answer: no chunks, arrival is its first and last
        assert 0.0 < end["started"] <= end["first"] == end["last"]
        assert end["seen"] == 0 and end["usage"] == (prompt, 6)


def test_no_plugin_times_or_scans_an_answer_itself() -> None:
    """The relay counts SSE events and has the request's parser read the usage, once:
    plugins read the context. The parsers (plugins/requesthandling/parsers) are the readers
    of usage; the Responses store alone reads a stream's events for their content (it keeps
    the answer)."""
    root = Path(heimdall_proxy.__file__).parent / "plugins"
    readers = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if re.search(r"sse_events|stream_usage|body_usage|b\"data:", path.read_text())
        and not str(path.relative_to(root)).startswith("requesthandling/")
    )
    assert readers == ["store/conversation.py", "store/responses_store.py"]
