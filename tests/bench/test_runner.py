"""bench/harness/runner.py: percentiles, metrics parsing, and open-loop runs against in-process pods."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from aiohttp import web

from bench.harness import runner, stats
from bench.harness.workloads import TimedRequest, Workload
from tests.conftest import PodFactory

# ---- pure functions -----------------------------------------------------------------------


def test_percentile_interpolates_like_numpy() -> None:
    values = [float(v) for v in range(10, 0, -1)]  # unsorted on purpose
    assert stats.percentile(values, 50) == pytest.approx(5.5)
    assert stats.percentile(values, 95) == pytest.approx(9.55)
    assert stats.percentile(values, 99) == pytest.approx(9.91)
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 100) == 10.0
    assert stats.percentile([3.0], 99) == 3.0
    assert stats.percentile([], 50) is None


def test_summary_percentiles_skip_failed_requests() -> None:
    results = [
        runner.RequestResult(f"r{i}", "short", "/v1/completions", 0.0, ttft=i / 100, e2e=float(i))
        for i in range(1, 101)
    ]
    results.append(
        runner.RequestResult("bad", "short", "/v1/completions", 0.0, e2e=999.0, error="HTTP 503: x")
    )
    s = runner.summarize(results, wall_clock=12.5)
    assert s["requests"] == 101
    assert s["ok"] == 100
    assert s["errors"] == 1
    assert s["error_kinds"] == {"HTTP 503": 1}
    assert s["wall_clock"] == 12.5
    assert s["e2e"]["p50"] == pytest.approx(50.5)
    assert s["e2e"]["p95"] == pytest.approx(95.05)
    assert s["e2e"]["p99"] == pytest.approx(99.01)
    assert s["ttft"]["p50"] == pytest.approx(0.505)
    assert s["by_tag"]["short"]["errors"] == 1


def test_parse_metrics_sums_label_sets() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_waiting Waiting.",
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="1",model_name="a b}c"} 2.0',
            "vllm:num_requests_running 4",
            'vllm:prefix_cache_queries_total{engine="0"} 100.0 1700000000000',
            "vllm:prefix_cache_hits_total{} NaN",
            "garbage",
            "",
        ]
    )
    m = runner.parse_metrics(text)
    assert m["vllm:num_requests_waiting"] == 5.0
    assert m["vllm:num_requests_running"] == 4.0
    assert m["vllm:prefix_cache_queries_total"] == 100.0
    assert "vllm:prefix_cache_hits_total" not in m
    sample = runner.pod_sample(m)
    assert sample["waiting"] == 5.0
    assert sample["kv"] is None


def test_prefix_hit_rate_from_counter_deltas() -> None:
    a = runner.PodSeries("a", "http://a")
    b = runner.PodSeries("b", "http://b")
    for t, q, h in ((0.0, 1000, 900), (1.0, 1100, 950), (2.0, 1300, 1000)):
        a.add(t, {"waiting": 1, "running": 2, "prefix_queries": q, "prefix_hits": h})
    for t, q, h in ((0.0, 0, 0), (2.0, 100, 50)):
        b.add(t, {"waiting": 0, "running": 0, "prefix_queries": q, "prefix_hits": h})
    # (100 + 50) hits over (300 + 100) queries; the counters' values before the run are ignored.
    assert runner.prefix_hit_rate([a, b]) == pytest.approx(150 / 400)
    no_counters = runner.PodSeries("c", "http://c")
    no_counters.add(0.0, {"waiting": 0})
    no_counters.add(1.0, {"waiting": 0})
    assert runner.prefix_hit_rate([no_counters]) is None
    stats = runner.pod_stats(a)
    assert stats["max_waiting"] == 1
    assert stats["busy_until"] == 2.0
    assert stats["prefix_hit_rate"] == pytest.approx(100 / 300)
    assert runner.pod_stats(b)["busy_until"] == 0.0


# ---- against in-process servers -----------------------------------------------------------


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class FakePod:
    """A scripted vLLM-like pod: the prompt decides what happens, /metrics counts scrapes."""

    def __init__(self, name: str, ttft: float = 0.05, token_delay: float = 0.002) -> None:
        self.name = name
        self.ttft = ttft
        self.token_delay = token_delay
        self.scrapes = 0
        self.release = asyncio.Event()
        self.arrivals: dict[str, float] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        n = self.scrapes
        return web.Response(
            text=f"vllm:num_requests_waiting 1\nvllm:num_requests_running 2\n"
            f"vllm:prefix_cache_queries_total {100 * n}\nvllm:prefix_cache_hits_total {40 * n}\n"
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt: str = body["prompt"]
        self.arrivals[prompt] = asyncio.get_running_loop().time()
        if "FAIL" in prompt:
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        await asyncio.sleep(self.ttft)
        if "HOLD" in prompt:
            await self.release.wait()
        n = body["max_tokens"]
        if not body.get("stream"):
            return web.json_response(
                {
                    "choices": [{"text": "x " * n}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": n},
                }
            )
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "x-sim-pod": self.name}
        )
        await resp.prepare(request)
        for i in range(n):
            if i:
                await asyncio.sleep(self.token_delay)
            if "BREAK" in prompt and i == 2:
                assert request.transport is not None
                request.transport.abort()
                return resp
            await resp.write(_sse({"choices": [{"text": f" t{i}", "finish_reason": None}]}))
        await resp.write(
            _sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
        )
        await resp.write(b"data: [DONE]\n\n")
        return resp


def _req(i: int, prompt: str, offset: float, stream: bool = True, n: int = 5) -> TimedRequest:
    body: dict[str, Any] = {"model": "m", "prompt": prompt, "max_tokens": n, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return TimedRequest(
        f"r{i}", offset, "/v1/completions", body, "fail" if "FAIL" in prompt else "ok"
    )


async def test_run_measures_ttft_e2e_errors_and_polls_pods(aiohttp_server: Any) -> None:
    pods = [FakePod("pod-a"), FakePod("pod-b")]
    servers = [await aiohttp_server(p.app()) for p in pods]
    urls = {p.name: str(s.make_url("")).rstrip("/") for p, s in zip(pods, servers, strict=True)}
    reqs = [
        _req(0, "hello", 0.0),
        _req(1, "hello again", 0.05),
        _req(2, "no stream", 0.05, stream=False, n=7),
        _req(3, "FAIL please", 0.1),
        _req(4, "BREAK please", 0.1, n=10),
        _req(5, "last", 0.3),
    ]
    run = await runner.run_workload(
        Workload("t", {}, reqs), urls["pod-a"], urls, poll_interval=0.05, progress=False
    )
    by_id = {r.id: r for r in run.requests}
    for rid in ("r0", "r1", "r5"):
        r = by_id[rid]
        assert r.ok, r.error
        assert r.status == 200
        assert r.pod == "pod-a"
        assert r.ttft is not None and r.e2e is not None
        assert 0.05 <= r.ttft < r.e2e
        assert r.completion_tokens == 5
        assert r.chunks == 6  # 5 tokens + the usage chunk
    assert by_id["r2"].ok and by_id["r2"].ttft is None and by_id["r2"].completion_tokens == 7
    assert by_id["r3"].error is not None and by_id["r3"].error.startswith("HTTP 503")
    assert by_id["r4"].error is not None
    assert by_id["r5"].sent >= 0.3

    s = run.summary
    assert (s["requests"], s["ok"], s["errors"]) == (6, 4, 2)
    assert s["error_kinds"]["HTTP 503"] == 1
    assert s["ttft"]["count"] == 3
    assert s["e2e"]["count"] == 4
    ok_e2e = [r.e2e for r in run.requests if r.ok and r.e2e is not None]
    assert s["e2e"]["p50"] == pytest.approx(stats.percentile(ok_e2e, 50))
    assert s["e2e"]["max"] == pytest.approx(max(ok_e2e))
    assert s["wall_clock"] >= max(r.sent + r.e2e for r in run.requests) - 0.01
    assert s["requests_per_pod"] == {"pod-a": 4}  # the broken stream had started
    # Scrapes every 50 ms on both pods; the fake's counters grow 100 queries / 40 hits a scrape.
    assert s["prefix_hit_rate"] == pytest.approx(0.4)
    for series in run.pods:
        assert len(series.t) >= 4
        assert series.t == sorted(series.t)
        assert set(series.columns["waiting"]) == {1.0}
    assert s["pods"]["pod-b"]["max_running"] == 2.0

    doc = run.to_json()
    assert json.loads(json.dumps(doc))["summary"]["errors"] == 2
    assert doc["pods"][0]["name"] == "pod-a" and "waiting" in doc["pods"][0]


@pytest.mark.slow
async def test_open_loop_sends_on_schedule_while_earlier_requests_hang(
    aiohttp_server: Any,
) -> None:
    pod = FakePod("pod-a", ttft=0.0)
    url = str((await aiohttp_server(pod.app())).make_url("")).rstrip("/")
    reqs = [_req(0, "HOLD me", 0.0), _req(1, "second", 0.1), _req(2, "third", 0.2)]

    async def release_later() -> None:
        await asyncio.sleep(0.5)
        pod.release.set()

    releaser = asyncio.create_task(release_later())
    run = await runner.run_workload(Workload("t", {}, reqs), url, {}, progress=False)
    await releaser
    by_id = {r.id: r for r in run.requests}
    # The held request did not delay the others: they went out at their offsets and finished
    # long before it.
    assert by_id["r1"].sent == pytest.approx(0.1, abs=0.05)
    assert by_id["r2"].sent == pytest.approx(0.2, abs=0.05)
    assert by_id["r1"].sent + by_id["r1"].e2e < 0.45
    assert by_id["r0"].e2e >= 0.5
    assert run.summary["errors"] == 0
    assert run.summary["prefix_hit_rate"] is None


async def test_connection_refused_is_an_error_not_a_crash() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = await runner.run_workload(
        Workload("t", {}, [_req(0, "x", 0.0)]), f"http://127.0.0.1:{port}", progress=False
    )
    assert run.summary["errors"] == 1
    assert run.summary["ttft"]["p50"] is None
    (kind,) = run.summary["error_kinds"]
    assert "Connect" in kind


async def test_against_the_simulated_pod(start_pod: PodFactory) -> None:
    pod = await start_pod()
    chat = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    reqs = [
        TimedRequest("c", 0.0, "/v1/chat/completions", chat, "chat"),
        _req(1, "completion", 0.0),
    ]
    reqs[1].body["model"] = "sim-model"
    run = await runner.run_workload(
        Workload("t", {}, reqs), pod.url, {pod.name: pod.url}, poll_interval=0.05, progress=False
    )
    assert run.summary["errors"] == 0, run.summary["error_kinds"]
    for r in run.requests:
        assert r.ttft is not None
        assert r.completion_tokens in (4, 5)
    assert run.pods[0].columns["waiting"][0] == 0.0
    assert run.pods[0].columns["running"][0] is not None
