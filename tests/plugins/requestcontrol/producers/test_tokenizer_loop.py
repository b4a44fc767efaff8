"""A long prompt on the tokenizer path must not freeze the gateway (issue 32, item 1): while
a multi-megabyte prompt is tokenized, `/health` and other requests are answered, on asyncio's
loop and on uvloop (the one `serve` runs on)."""

from __future__ import annotations

import asyncio
import io
import itertools
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import uvloop
from aiohttp.test_utils import TestServer

from heimdall_proxy.config.gateway import parse_config
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.server.app import create_app
from heimdall_proxy.sim import SimOptions, SimPod
from tests.tokenization.model import WORDS, make_model_dir

#: ~4 MB of prompt: ~2 s of `tokenizers` work with the test tokenizer on this machine, which
#: held the event loop (and so every other request) for all of it before the fix.
PROMPT_CHARS = 4_000_000
#: The longest the gateway may go without answering /health or a small request while the
#: prompt is tokenized (the old code: seconds). The simulated pod, on the same event loop,
#: takes ~0.3 s of it to count the prompt's tokens before it refuses the prompt.
BOUND = 1.0

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def _tokenizer(model_dir: Path) -> list[dict[str, Any]]:
    # maxPromptChars high enough that the prompt is tokenized, not skipped as too long
    params = {"modelName": str(model_dir), "maxPromptChars": 2 * PROMPT_CHARS}
    return [{"type": "tokenizer", "parameters": params}, {"type": "queue-scorer"}]


def _precise(model_dir: Path) -> list[dict[str, Any]]:
    pool = {"modelName": str(model_dir), "workersCount": 1, "maxPromptChars": 2 * PROMPT_CHARS}
    params = {
        "indexerConfig": {"tokenizersPoolConfig": pool},
        # no event feed: the scorer tokenizes and looks up all the same
        "kvEventsConfig": {"discoverPods": False, "decodeProcesses": 0},
    }
    return [{"type": "precise-prefix-cache-scorer", "parameters": params}]


#: The two plugins that tokenize in-process.
PLUGINS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    "tokenizer": _tokenizer,
    "precise-prefix-cache-scorer": _precise,
}


def long_prompt(chars: int) -> str:
    rnd = random.Random(32)
    words: list[str] = []
    n = 0
    while n < chars:
        word = rnd.choice(WORDS)
        words.append(word)
        n += len(word) + 1
    return " ".join(words)


async def scenario(plugin: str, model_dir: Path, prompt: str) -> tuple[int, list[float]]:
    """The big request's status, and the times (perf_counter) of: its sending, each answer
    to /health and to a small request asked one after the other while it was in flight, and
    its answer."""
    pod = SimPod(SimOptions(name="pod-0", time_scale=0.01))
    pod_server = TestServer(pod.app())
    await pod_server.start_server()
    doc: dict[str, Any] = {
        "featureGates": ["prepareDataPlugins"],
        "plugins": PLUGINS[plugin](model_dir),
        "endpoints": [{"name": "pod-0", "url": str(pod_server.make_url("")).rstrip("/")}],
    }
    app = create_app(
        parse_config(doc, "<test>"), ServerOptions(metrics_interval=0.05, startup_timeout=2.0)
    )
    gw = TestServer(app)
    await gw.start_server()
    times: list[float] = []
    try:
        async with aiohttp.ClientSession() as http:
            base = str(gw.make_url("")).rstrip("/")
            body = {
                "model": "sim-model",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": prompt}],
            }
            times.append(time.perf_counter())
            big = asyncio.create_task(
                http.post(
                    f"{base}/v1/chat/completions",
                    # a stream: aiohttp warns about sending this much as one bytes object
                    data=io.BytesIO(orjson.dumps(body)),
                    headers={"Content-Type": "application/json"},
                )
            )
            big.add_done_callback(lambda _: times.append(time.perf_counter()))
            small = {"model": "sim-model", "max_tokens": 1, "prompt": "hello world"}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not big.done() and loop.time() < deadline:
                async with http.get(f"{base}/health") as r:
                    assert r.status == 200
                    await r.read()
                times.append(time.perf_counter())
                async with http.post(f"{base}/v1/completions", json=small) as r:
                    assert r.status == 200
                    await r.read()
                times.append(time.perf_counter())
                await asyncio.sleep(0.005)
            resp = await big
            status = resp.status
            assert resp.headers.get("x-sim-pod") == "pod-0"  # it went through to the pod
            await resp.read()
            resp.release()
    finally:
        await gw.close()
        await pod_server.close()
    return status, sorted(times)


@pytest.mark.parametrize(
    ("plugin", "loop"),
    [("tokenizer", "asyncio"), ("tokenizer", "uvloop"), ("precise-prefix-cache-scorer", "uvloop")],
)
@pytest.mark.slow
def test_health_is_answered_while_a_long_prompt_is_tokenized(
    plugin: str, loop: str, tmp_path: Path
) -> None:
    model_dir = make_model_dir(tmp_path / "tiny")
    prompt = long_prompt(PROMPT_CHARS)
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        status, times = runner.run(scenario(plugin, model_dir, prompt))
    # the pod refuses a prompt beyond its context, as vLLM does: what matters is that it
    # got there, and what the gateway did meanwhile
    assert status == 400
    # the loop kept serving while the prompt was tokenized: answers to /health and small
    # requests kept coming, never more than BOUND apart, from the big request's sending to
    # its answer (before the fix, none came for as long as the tokenizer ran)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) >= 6, gaps
    assert max(gaps) < BOUND, (
        f"{max(gaps):.2f} s without an answer; total {times[-1] - times[0]:.2f} s"
    )
