"""Processes the benchmarks start (pods, gateways, peers, load generators' targets): one class
for starting, watching and stopping them, free loopback ports and readiness polls.

Every process leads its own session (`start_new_session`), so Ctrl-C reaches the benchmark
only, which then stops what it started in order, and a stop signals exactly that process
group, workers included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import aiohttp

from bench.harness.machine import REPO_ROOT

HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class HarnessError(RuntimeError):
    """The benchmark could not run (missing tool, a server that did not start, ...)."""


# ---- ports and commands -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports (all bound at once, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def console_script(name: str, module: str) -> list[str]:
    """A console script next to this interpreter, else on PATH, else `python -m module`."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return [str(local)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", module]


def heimdall_cmd() -> list[str]:
    """This checkout's `heimdall-proxy`: the venv's, else PATH's, else `python -m`."""
    return console_script("heimdall-proxy", "heimdall_proxy")


def bench_module(module: str) -> list[str]:
    """The argv that runs one of the bench's own modules (`bench.harness.fast_upstream`, ...)
    as a subprocess: `python -m`, from the checkout's root, so `bench` is importable."""
    return [sys.executable, "-m", module]


# ---- one process --------------------------------------------------------------------------


@dataclass
class Proc:
    """A started subprocess with its output in `log_path`."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> Proc:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        """The process's id, which is also its process group's (it leads its session)."""
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the process so far (Linux /proc), None elsewhere."""
        if not self.alive():
            return None
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, ValueError, IndexError):
            return None

    def signal_group(self, sig: signal.Signals) -> None:
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def stop(self, grace: float = 5.0) -> None:
        stop_servers([self], grace)

    def tail(self, n: int = 20) -> str:
        if self._log is not None:
            self._log.flush()
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return f"(cannot read {self.log_path})"


def start_server(name: str, argv: list[str], workdir: Path) -> Proc:
    """Start `argv` with its output in `workdir/<name>.log`."""
    return Proc(name, argv, workdir / f"{name}.log").start()


def stop_servers(procs: Sequence[Proc], grace: float = 5.0) -> None:
    """SIGTERM every process group (last started first), wait up to `grace` seconds in all,
    SIGKILL what is left, then any stragglers of each group (a gateway's workers)."""
    for proc in reversed(procs):
        proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in reversed(procs):
        if proc.popen is not None:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {proc.name} did not exit after SIGTERM; killing it", file=sys.stderr)
                proc.signal_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=5)
            proc.signal_group(signal.SIGKILL)
        if proc._log is not None:
            proc._log.close()
            proc._log = None


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of all live processes in process group ``pgid``."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # fields[0] is field 3 (state)
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLK_TCK


# ---- readiness ----------------------------------------------------------------------------


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body) of a GET; (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def wait_until(proc: Proc, check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll `check` every 0.1 s until it passes; RuntimeError with the log's tail if `proc`
    exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited while waiting for {what}:\n{proc.tail()}")
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what} ({proc.name}):\n{proc.tail()}")


async def wait_http(url: str, tries: int = 300) -> None:
    """Wait until `url` answers below 500 (a pod or gateway process is up), polling every
    0.1 s; RuntimeError after `tries` polls."""
    async with aiohttp.ClientSession() as http:
        for _ in range(tries):
            try:
                async with http.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never answered")


def _http(
    method: str, url: str, body: bytes | None = None, timeout: float = 2.0
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _models_nonempty(status: int, body: bytes) -> bool:
    if status != 200:
        return False
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return False
    return isinstance(data, list) and len(data) > 0


def _chat_ok(status: int, body: bytes) -> bool:
    if status != 200:
        return False
    try:
        choices = json.loads(body).get("choices")
    except (ValueError, AttributeError):
        return False
    return isinstance(choices, list) and len(choices) > 0


def wait_ready(
    server: Proc, url: str, check: str, deadline: float, chat_body: bytes | None = None
) -> None:
    """Poll ``url`` until ``check`` passes, the process dies, or the deadline passes."""
    last = "no answer yet"
    while True:
        code = server.popen.poll()
        if code is not None:
            raise HarnessError(
                f"{server.name} exited with code {code} during start-up.\n"
                f"command: {shlex.join(server.argv)}\n"
                f"--- last lines of {server.log_path} ---\n{server.tail(40)}"
            )
        try:
            if check == "health":
                status, body = _http("GET", url)
                ok = status == 200
            elif check == "models":
                status, body = _http("GET", url)
                ok = _models_nonempty(status, body)
            else:
                status, body = _http("POST", url, chat_body)
                ok = _chat_ok(status, body)
            if ok:
                return
            last = f"HTTP {status}: {body[:200]!r}"
        except (OSError, urllib.error.URLError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise HarnessError(
                f"{server.name} not ready at {url} ({check}) before the start-up timeout; "
                f"last: {last}\ncommand: {shlex.join(server.argv)}\n"
                f"--- last lines of {server.log_path} ---\n{server.tail(40)}"
            )
        time.sleep(0.2)
