"""Replay a workload open-loop against one base URL and measure it.

Open loop: every request is launched at its offset whatever happened to the earlier ones, so a
slow router builds queues instead of slowing the client down. Streaming requests give TTFT (time
to the first chunk that carries generated text) and end-to-end latency; non-streaming ones only
end-to-end latency. While the workload runs, every pod's /metrics is polled every
``--poll-interval`` seconds (0.25) for vLLM's waiting and running gauges, KV-cache usage and the
prefix-cache and preemption counters; the prefix-cache hit rate is the hits delta over the
queries delta between the samples taken just before the first request and just after the last.

    python -m bench.harness.runner --base-url http://127.0.0.1:8000 \\
        --pod http://127.0.0.1:8001 --pod http://127.0.0.1:8002 \\
        --workload seed001-small --out bench/out/run.json

Output JSON: ``meta`` (workload, target, options), ``summary`` (wall clock, TTFT and E2E
percentiles overall and per tag, errors, hit rate, per-pod queue statistics), ``requests`` (one
record per request) and ``pods`` (per-pod time series, one list per field).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.harness import cli
from bench.harness.stats import distribution, percentile
from bench.harness.workloads import TimedRequest, Workload, add_workload_args, workload_from_args

# vLLM metric names the poller reads (the sum over label sets is taken for each).
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREEMPTIONS = ("vllm:num_preemptions_total",)

SERIES_FIELDS = ("waiting", "running", "kv", "prefix_queries", "prefix_hits", "preemptions")
POD_HEADERS = ("x-sim-pod", "x-decoder-host-port")


# ---- Prometheus text ----------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Sum of the samples of each metric name in a Prometheus text exposition (labels
    dropped). Malformed lines are skipped."""
    sums: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            rest = line[line.rfind("}") + 1 :].split()
        else:
            name, *rest = line.split()
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        sums[name] = sums.get(name, 0.0) + value
    return sums


def _first(metrics: Mapping[str, float], names: Sequence[str]) -> float | None:
    for name in names:
        if name in metrics:
            return metrics[name]
    return None


def pod_sample(metrics: Mapping[str, float]) -> dict[str, float | None]:
    return {
        "waiting": metrics.get(WAITING),
        "running": metrics.get(RUNNING),
        "kv": _first(metrics, KV_USAGE),
        "prefix_queries": _first(metrics, PREFIX_QUERIES),
        "prefix_hits": _first(metrics, PREFIX_HITS),
        "preemptions": _first(metrics, PREEMPTIONS),
    }


@dataclass(slots=True)
class PodSeries:
    """One pod's samples, column-wise (`t` in seconds since the run started)."""

    name: str
    url: str
    t: list[float] = field(default_factory=list)
    columns: dict[str, list[float | None]] = field(
        default_factory=lambda: {k: [] for k in SERIES_FIELDS}
    )
    failures: int = 0

    def add(self, t: float, sample: Mapping[str, float | None]) -> None:
        self.t.append(round(t, 4))
        for key in SERIES_FIELDS:
            self.columns[key].append(sample.get(key))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "t": self.t, **self.columns,
                "scrape_failures": self.failures}  # fmt: skip


def counter_delta(series: PodSeries, key: str) -> float | None:
    """Last minus first value of a counter (None when the pod never exposed it)."""
    values = [v for v in series.columns[key] if v is not None]
    if len(values) < 2:
        return None
    return max(0.0, values[-1] - values[0])


def prefix_hit_rate(pods: Sequence[PodSeries]) -> float | None:
    hits = queries = 0.0
    seen = False
    for pod in pods:
        q = counter_delta(pod, "prefix_queries")
        h = counter_delta(pod, "prefix_hits")
        if q is None or h is None:
            continue
        seen = True
        queries += q
        hits += h
    if not seen or queries <= 0:
        return None
    return hits / queries


def pod_stats(pod: PodSeries) -> dict[str, Any]:
    waiting = [v for v in pod.columns["waiting"] if v is not None]
    running = [v for v in pod.columns["running"] if v is not None]
    # When the pod last had work: 0 if never (in the samples taken), None without samples.
    busy_until = 0.0 if pod.t else None
    for t, w, r in zip(pod.t, pod.columns["waiting"], pod.columns["running"], strict=True):
        if (w or 0) + (r or 0) > 0:
            busy_until = t
    q = counter_delta(pod, "prefix_queries")
    h = counter_delta(pod, "prefix_hits")
    return {
        "url": pod.url,
        "samples": len(pod.t),
        "scrape_failures": pod.failures,
        "max_waiting": max(waiting, default=None),
        "mean_waiting": sum(waiting) / len(waiting) if waiting else None,
        "max_running": max(running, default=None),
        "busy_until": busy_until,
        "prefix_hit_rate": (h / q) if q and h is not None else None,
        "preemptions": counter_delta(pod, "preemptions"),
    }


# ---- requests -----------------------------------------------------------------------------


@dataclass(slots=True)
class RequestResult:
    id: str
    tag: str
    path: str
    offset: float
    #: when it was actually sent, seconds since the start
    sent: float = 0.0
    status: int | None = None
    ttft: float | None = None
    e2e: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    pod: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _has_text(doc: dict[str, Any]) -> bool:
    """Does one SSE event carry generated text (completions, chat or responses shape)?"""
    for choice in doc.get("choices") or ():
        if choice.get("text"):
            return True
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            return True
    return doc.get("type") == "response.output_text.delta" and bool(doc.get("delta"))


def _usage(doc: dict[str, Any], result: RequestResult) -> None:
    usage = doc.get("usage") or (doc.get("response") or {}).get("usage")
    if isinstance(usage, dict):
        result.prompt_tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
        result.completion_tokens = usage.get("completion_tokens", usage.get("output_tokens"))


async def _read_stream(resp: aiohttp.ClientResponse, result: RequestResult, t0: float) -> None:
    done = False
    text_chunks = 0
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            break
        result.chunks += 1
        # Parse every event until the first token; after it only the ones that can end the
        # stream or carry usage, to keep the client's CPU out of the measurement.
        if result.ttft is not None and b'"usage"' not in payload and b"completed" not in payload:
            text_chunks += 1
            continue
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if result.ttft is None and _has_text(doc):
            result.ttft = time.perf_counter() - t0
            text_chunks += 1
        _usage(doc, result)
        if doc.get("type") == "response.completed":
            done = True
    if not done:
        result.error = "incomplete stream"
    if result.completion_tokens is None and text_chunks:
        result.completion_tokens = text_chunks


async def send_one(
    session: aiohttp.ClientSession,
    base_url: str,
    req: TimedRequest,
    result: RequestResult,
    request_timeout: float,
) -> None:
    """Send one request and fill `result` (never raises, except cancellation)."""
    t0 = time.perf_counter()
    try:
        async with session.post(
            base_url + req.path,
            data=orjson.dumps(req.body),
            headers={"Content-Type": "application/json", **req.headers},
            timeout=aiohttp.ClientTimeout(total=request_timeout),
        ) as resp:
            result.status = resp.status
            result.pod = next((resp.headers[h] for h in POD_HEADERS if h in resp.headers), None)
            if resp.status != 200:
                body = await resp.read()
                result.error = f"HTTP {resp.status}: {body[:200].decode('utf-8', 'replace')}"
            elif req.body.get("stream") is True:
                await _read_stream(resp, result, t0)
            else:
                doc = orjson.loads(await resp.read())
                _usage(doc, result)
    except TimeoutError:
        result.error = "timeout"
    except aiohttp.ClientError as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    except (ValueError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    result.e2e = time.perf_counter() - t0


def error_kind(error: str) -> str:
    """The error's kind: "HTTP 503", "timeout", "incomplete stream", "ClientConnectorError"."""
    return error.split(":", 1)[0]


def summarize(
    results: Sequence[RequestResult],
    wall_clock: float,
    pods: Sequence[PodSeries] = (),
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    errors = Counter(error_kind(r.error) for r in results if r.error is not None)
    by_tag: dict[str, Any] = {}
    for tag in sorted({r.tag for r in results}):
        tagged = [r for r in ok if r.tag == tag]
        by_tag[tag] = {
            "requests": sum(1 for r in results if r.tag == tag),
            "errors": sum(1 for r in results if r.tag == tag and not r.ok),
            "ttft": distribution([r.ttft for r in tagged if r.ttft is not None]),
            "e2e": distribution([r.e2e for r in tagged if r.e2e is not None]),
        }
    per_pod_requests = Counter(r.pod for r in results if r.pod)
    per_pod_tokens: Counter[str] = Counter()
    for r in ok:
        if r.pod:
            per_pod_tokens[r.pod] += r.completion_tokens or 0
    pod_summary = {p.name: pod_stats(p) for p in pods}
    # Pods that never had work (a router that ignored them) say nothing about the drain.
    busy = [s["busy_until"] for s in pod_summary.values() if s["busy_until"]]
    lag = [r.sent - r.offset for r in results]
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "wall_clock": wall_clock,
        "ttft": distribution([r.ttft for r in ok if r.ttft is not None]),
        "e2e": distribution([r.e2e for r in ok if r.e2e is not None]),
        "by_tag": by_tag,
        "prefix_hit_rate": prefix_hit_rate(pods),
        "pods": pod_summary,
        "pods_drained": {"first": min(busy), "last": max(busy)} if busy else None,
        "requests_per_pod": dict(sorted(per_pod_requests.items())),
        "output_tokens_per_pod": dict(sorted(per_pod_tokens.items())),
        "send_lag": {"p50": percentile(lag, 50), "max": max(lag, default=None)},
        "completion_tokens": sum(r.completion_tokens or 0 for r in ok),
    }


# ---- the run ------------------------------------------------------------------------------


class MetricsPoller:
    """Polls every pod's /metrics on its own session until stopped."""

    def __init__(self, pods: Mapping[str, str], interval: float, clock: Callable[[], float]):
        self.series = [PodSeries(name, url.rstrip("/")) for name, url in pods.items()]
        self.interval = interval
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> MetricsPoller:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=max(1.0, 4 * self.interval))
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _one(self, pod: PodSeries) -> None:
        assert self._session is not None
        try:
            async with self._session.get(pod.url + "/metrics") as resp:
                if resp.status != 200:
                    pod.failures += 1
                    return
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            pod.failures += 1
            return
        pod.add(self.clock(), pod_sample(parse_metrics(text)))

    async def sample(self) -> None:
        await asyncio.gather(*(self._one(pod) for pod in self.series))

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not stop.is_set():
            await self.sample()
            next_at += self.interval
            delay = next_at - loop.time()
            if delay < 0:  # fell behind: do not try to catch up with a burst of scrapes
                next_at = loop.time()
                delay = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


@dataclass(slots=True)
class RunResult:
    meta: dict[str, Any]
    summary: dict[str, Any]
    requests: list[RequestResult]
    pods: list[PodSeries]

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "summary": self.summary,
            "requests": [asdict(r) for r in self.requests],
            "pods": [p.to_json() for p in self.pods],
        }

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2))


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bench extra is not installed: run without a bar
        return None
    return tqdm(total=total, desc=desc, unit="req", dynamic_ncols=True, smoothing=0.05)


async def run_workload(
    workload: Workload,
    base_url: str | Sequence[str],
    pods: Mapping[str, str] | None = None,
    *,
    poll_interval: float = 0.25,
    request_timeout: float = 3600.0,
    progress: bool = True,
    label: str = "",
) -> RunResult:
    """Replay `workload` open-loop against `base_url`, polling `pods` ({name: url}). With
    several base URLs (gateway replicas behind a balancer), requests are dealt to them in
    turn, in send order."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    urls = [u.rstrip("/") for u in urls]
    base_url = ",".join(urls)
    requests = sorted(workload.requests, key=lambda r: r.offset)
    results = [RequestResult(r.id, r.tag, r.path, r.offset) for r in requests]
    bar = _progress(len(requests), label or base_url, progress)
    errors = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    loop = asyncio.get_running_loop()
    start = loop.time()

    def clock() -> float:
        return loop.time() - start

    stop = asyncio.Event()
    async with MetricsPoller(pods or {}, poll_interval, clock) as poller:
        # Baseline counters before the first request, so deltas cover exactly this run.
        await poller.sample()
        poll_task = asyncio.create_task(poller.run(stop))
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(req: TimedRequest, result: RequestResult, url: str) -> None:
                nonlocal errors
                result.sent = round(clock(), 6)
                await send_one(session, url, req, result, request_timeout)
                if bar is not None:
                    errors += not result.ok
                    bar.update(1)
                    if errors:
                        bar.set_postfix(errors=errors, refresh=False)

            tasks = []
            for i, (req, result) in enumerate(zip(requests, results, strict=True)):
                delay = req.offset - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(req, result, urls[i % len(urls)])))
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
        wall_clock = clock()
        stop.set()
        await poll_task
        await poller.sample()  # final counters
    if bar is not None:
        bar.close()
    summary = summarize(results, wall_clock, poller.series)
    meta = {
        "workload": workload.name,
        "workload_params": workload.params,
        "base_url": base_url,
        "label": label,
        "pods": dict(pods or {}),
        "poll_interval": poll_interval,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return RunResult(meta, summary, results, poller.series)


def format_summary(summary: Mapping[str, Any]) -> str:
    def ms(d: Mapping[str, Any], key: str) -> str:
        v = d.get(key)
        return "-" if v is None else f"{v * 1000:.0f}"

    lines = [
        f"requests {summary['requests']}  ok {summary['ok']}  errors {summary['errors']}"
        + (f" {summary['error_kinds']}" if summary["errors"] else ""),
        f"wall clock {summary['wall_clock']:.2f} s",
    ]
    for name in ("ttft", "e2e"):
        d = summary[name]
        lines.append(
            f"{name.upper():4s} ms  p50 {ms(d, 'p50')}  p95 {ms(d, 'p95')}  p99 {ms(d, 'p99')}"
            f"  (n={d['count']})"
        )
    rate = summary.get("prefix_hit_rate")
    lines.append("prefix-cache hit rate " + ("n/a" if rate is None else f"{rate:.1%}"))
    for name, pod in summary.get("pods", {}).items():
        lines.append(
            f"  {name}: max waiting {pod['max_waiting']}, busy until {pod['busy_until']} s"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("Replay a workload open-loop against a router and poll the pods' /metrics.")
    parser.add_argument("--base-url", required=True, help="router (or pod) base URL")
    parser.add_argument(
        "--pod",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="a pod whose /metrics to poll (repeat)",
    )
    parser.add_argument("--poll-interval", type=float, default=0.25)
    parser.add_argument("--timeout", type=float, default=3600.0, help="per request, seconds")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every offset")
    parser.add_argument("--out", help="write the results JSON here")
    cli.add_progress(parser)
    add_workload_args(parser)
    args = parser.parse_args(argv)
    try:
        workload = workload_from_args(args).scaled(args.time_scale)
    except ValueError as exc:
        parser.error(str(exc))
    pods = {}
    for i, spec in enumerate(args.pod):
        name, sep, url = spec.partition("=")
        pods[name if sep else f"pod-{i}"] = url if sep else spec
    print(workload.describe(), file=sys.stderr)
    result = asyncio.run(
        run_workload(
            workload,
            args.base_url,
            pods,
            poll_interval=args.poll_interval,
            request_timeout=args.timeout,
            progress=not args.no_progress,
        )
    )
    print(format_summary(result.summary))
    if args.out:
        result.save(args.out)
        print(f"saved {args.out}", file=sys.stderr)
    return 0 if result.summary["errors"] == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
