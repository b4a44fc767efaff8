"""Shutdown with real processes: SIGTERM drains (readiness first, then the listener), and the
KV-event worker processes die with a gateway killed by SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import textwrap
import time
from asyncio.subprocess import Process
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import free_port, wait_http


@contextlib.asynccontextmanager
async def pod_and_gateway(tmp_path: Path, *flags: str) -> AsyncIterator[tuple[Process, str]]:
    """A simulated pod and a gateway in front of it, both real processes (the gateway with
    `flags`): the gateway's process and base URL, both killed at the end if still alive."""
    pod_port, gw_port = free_port(), free_port()
    py = sys.executable
    pod = await asyncio.create_subprocess_exec(
        py, "-m", "heimdall_proxy", "sim", "--host", "127.0.0.1", "--port", str(pod_port),
        "--name", "p0", stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(f"endpoints:\n- name: p0\n  url: http://127.0.0.1:{pod_port}\n")
    gw = await asyncio.create_subprocess_exec(
        py, "-m", "heimdall_proxy", "serve", "--config", str(cfg), "--host", "127.0.0.1",
        "--port", str(gw_port), *flags, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{gw_port}"
    try:
        await wait_http(f"http://127.0.0.1:{pod_port}/health")
        await wait_http(base + "/ready")
        yield gw, base
    finally:
        for proc in (gw, pod):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@pytest.mark.slow
async def test_sigterm_turns_unready_then_drains(tmp_path: Path) -> None:
    async with pod_and_gateway(tmp_path, "--drain-delay", "3s") as (gw, base):
        async with aiohttp.ClientSession() as http:
            gw.send_signal(signal.SIGTERM)
            # The gateway turns unready when its loop runs the signal handler: polled, since a
            # loaded machine can take longer than any fixed wait (the listener stays open for
            # the drain delay).
            deadline = time.monotonic() + 2.5
            while True:
                async with http.get(base + "/ready") as r:
                    if r.status == 503:
                        assert (await r.json())["draining"] is True
                        break
                assert time.monotonic() < deadline, "still ready after SIGTERM"
                await asyncio.sleep(0.02)
            body = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
            async with http.post(base + "/v1/completions", json=body) as r:
                assert r.status == 200  # still served while draining
        assert await asyncio.wait_for(gw.wait(), 20) == 0


@pytest.mark.slow
async def test_sigterm_exits_within_the_drain_timeout_with_a_request_still_running(
    tmp_path: Path,
) -> None:
    """A stream that outlives --drain-timeout is cut at the timeout, and the process exits
    then: Kubernetes kills at its grace period, so the drain timeout must be the whole wait
    (it was about twice that)."""
    async with pod_and_gateway(tmp_path, "--drain-timeout", "2s") as (gw, base):
        # thousands of decode steps: far longer than the drain timeout
        body = {"model": "sim-model", "prompt": "hi", "max_tokens": 5000, "stream": True}
        async with aiohttp.ClientSession() as http:
            async with http.post(base + "/v1/completions", json=body) as r:
                assert r.status == 200
                await r.content.readline()  # the stream has started
                gw.send_signal(signal.SIGTERM)
                sent = time.monotonic()
                assert await asyncio.wait_for(gw.wait(), 30) == 0
                took = time.monotonic() - sent
        assert took < 2.0 + 1.5, f"exited {took:.1f}s after SIGTERM with --drain-timeout 2s"


WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    from heimdall_proxy.kvcache.prepare import EventPreparer

    async def main():
        p = EventPreparer(16, "m", processes=1)
        p.start()
        await p.prepare([b"\\x90"])
        print(" ".join(map(str, children(os.getpid()))), flush=True)
        await asyncio.sleep(600)

    def children(ppid):
        # Other processes on the machine come and go between listdir and open (one that is
        # gone is skipped, not a crash that prints nothing), and a process's name, which
        # comes before its parent's pid, may hold spaces: the fields after the last ")".
        out = []
        for x in os.listdir("/proc"):
            if x.isdigit():
                try:
                    with open(f"/proc/{x}/stat") as f:
                        fields = f.read().rpartition(")")[2].split()
                except OSError:
                    continue
                if fields[1] == str(ppid):
                    out.append(int(x))
        return out

    asyncio.run(main())
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
async def test_kv_event_workers_die_with_a_sigkilled_gateway() -> None:
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WORKER_SCRIPT, stdout=asyncio.subprocess.PIPE
    )
    assert parent.stdout is not None
    line = await asyncio.wait_for(parent.stdout.readline(), 60)
    children = [int(x) for x in line.split()]
    assert children, "no worker process was started"
    parent.kill()  # SIGKILL: no cleanup runs in the parent
    await parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in children):
        assert time.monotonic() < deadline, "a worker outlived its parent"
        await asyncio.sleep(0.2)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited; a name may hold spaces, hence the last ")")."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
