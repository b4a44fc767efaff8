"""CPU per call of finish-time-scorer's `score` at a large pool, by how many pods are busy.

Every pod has a pace of its own (a stream ran to its end there), `--busy` of them have two
streams in flight each, and the request holds none of its prompt anywhere: the scorer then
prices every pod's pace and replays the busy ones (bench/RESULTS.md, "Finish time").

Run: python -m bench.probes.finish_time_cost [--pods 1024] [--busy 0 64 256] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

from bench.harness.stats import percentile
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    ProfileResult,
    RequestContext,
    SchedulingResult,
)
from heimdall_proxy.plugins.scheduling.scorers.finish_time import (
    FinishTimeParams,
    FinishTimeScorer,
)


def _pod(i: int) -> Endpoint:
    name = f"pod-{i}"
    return Endpoint(name=name, url=f"http://{name}:8000", host=name, port=8000, metrics=Metrics())


def _request(max_tokens: int, stream: bool) -> InferenceRequest:
    data = {"model": "m", "prompt": "x" * 400, "max_tokens": max_tokens, "stream": stream}
    request = InferenceRequest(api="completions", path="/v1/completions", model="m", body=b"{}",
                               data=data, headers={})  # fmt: skip
    request.stream = stream
    return request


def _sent(load: InFlightLoad, key: str, pod: Endpoint, request: InferenceRequest) -> RequestContext:
    result = SchedulingResult({"default": ProfileResult([pod], [pod])}, "default")
    ctx = RequestContext(request, CycleState(), result, pod)
    ctx.key = key
    load.acquire(key, pod.name, now=0.0, ctx=ctx)
    return ctx


def measure(pods: int, busy: int, calls: int) -> tuple[float, float]:
    """(p50, p99) milliseconds of CPU per `score` call."""
    endpoints = [_pod(i) for i in range(pods)]
    load = InFlightLoad()
    scorer = FinishTimeScorer(
        "finish-time-scorer", FinishTimeParams(), PluginHandle(EndpointPool([]), load=load)
    )
    for i, pod in enumerate(endpoints):  # a stream that ran to its end on every pod
        ctx = _sent(load, f"done-{i}", pod, _request(5, True))
        ctx.chunk_arrived(1, 0.1)
        ctx.chunk_arrived(4, 0.2)
        load.release(ctx.key)
    for i, pod in enumerate(endpoints[:busy]):
        for j in range(2):
            _sent(load, f"run-{i}-{j}", pod, _request(100, True)).chunk_arrived(10, 0.5)
    request, state = _request(100, False), CycleState()
    times = []
    for _ in range(calls):
        t = time.process_time()
        scorer.score(state, request, endpoints)
        times.append(time.process_time() - t)
    return (percentile(times, 50) or 0.0) * 1e3, (percentile(times, 99) or 0.0) * 1e3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1024)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 64, 256])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}; CPU ms per score call at {args.pods} pods")
    print("| busy pods (2 streams each) | p50 | p99 |\n|---:|---:|---:|")
    for busy in args.busy:
        p50, p99 = measure(args.pods, busy, args.calls)
        print(f"| {busy} | {p50:.3f} | {p99:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
